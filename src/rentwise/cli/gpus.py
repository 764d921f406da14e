"""`rentwise gpus [FILTER]`: the GPU spec catalog as a table or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rentwise.cli.render import catalog_table, emit_json, json_option, stdout_console, to_jsonable
from rentwise.errors import NotFoundError, did_you_mean
from rentwise.hardware.catalog import GpuSpec, load_gpus, normalize_name, user_catalog_path
from rentwise.units import gib, parse_size


@click.command(
    epilog="Peaks are dense (no 2:4 sparsity); '-' means the source gives no figure. 'usable' is the total "
    "nvidia-smi shows (ECC reservation and driver reserve taken off, CUDA context not). Your own rows in "
    f"{user_catalog_path()} (same schema as --json) override or extend the catalog."
)
@click.argument("filter_text", metavar="[FILTER]", required=False, default="")
@click.option(
    "--min-memory", default=None, metavar="GiB", help="Only cards with at least this nameplate memory."
)
@click.option(
    "--catalog",
    "extra_files",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Extra GPU TOML file(s) on top of the catalog.",
)
@json_option
def command(filter_text: str, min_memory: str | None, extra_files: tuple[Path, ...], as_json: bool) -> None:
    """List the GPU spec catalog; FILTER matches names, aliases, vendor and architecture."""
    gpus = select_gpus(load_gpus(extra_files), filter_text, min_memory)
    if as_json:
        emit_json([gpu_record(gpu) for gpu in gpus])
        return
    stdout_console().print(gpu_table(gpus))


def select_gpus(gpus: tuple[GpuSpec, ...], filter_text: str, min_memory: str | None) -> list[GpuSpec]:
    """Rows matching the filter and memory floor; raise `NotFoundError` when none does."""
    needle = normalize_name(filter_text) if filter_text else ""
    matched = [gpu for gpu in gpus if not needle or needle in _haystack(gpu)]
    if min_memory is not None:
        floor_bytes = parse_size(min_memory)
        matched = [gpu for gpu in matched if gpu.memory_bytes >= floor_bytes]
    if not matched:
        described = f"'{filter_text}'" if filter_text else "the filters"
        suggestion = did_you_mean(filter_text, [gpu.name for gpu in gpus]) if filter_text else ""
        raise NotFoundError(
            f"no GPU in the catalog matches {described}{suggestion}", hint="run `rentwise gpus`"
        )
    return matched


def _haystack(gpu: GpuSpec) -> str:
    family = gpu.architecture.split(" (")[0]  # "Ampere (GA100)" -> "Ampere": die names would match "a100"
    return " ".join(normalize_name(text) for text in (gpu.name, *gpu.aliases, gpu.vendor, family))


def gpu_record(gpu: GpuSpec) -> dict[str, Any]:
    """A GPU as JSON: every field plus the derived usable memory and how it was obtained."""
    record: dict[str, Any] = to_jsonable(gpu)
    record["usable_bytes"] = gpu.usable_bytes
    record["usable_rule"] = gpu.usable_rule
    return record


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def gpu_table(gpus: list[GpuSpec]) -> Any:
    """A rich table of the catalog rows."""
    table = catalog_table(
        "GPU catalog: memory GiB, bandwidth GB/s, dense TFLOPS",
        "usable: what nvidia-smi shows as total. 16-bit: bf16 tensor peak, or fp16 (marked *) where "
        "the card has no bf16. NVLink GB/s (? = speed unknown). TDP in W.",
    )
    for header in ("GPU", "GiB", "usable", "GB/s", "16-bit", "fp8", "fp32", "NVLink", "TDP", "CC"):
        table.add_column(header, justify="right", min_width=len(header))
    table.columns[0].justify = "left"
    table.columns[0].min_width = max(len(gpu.name) for gpu in gpus)
    for gpu in gpus:
        nvlink = "?" if gpu.nvlink_gbps is None else ("-" if gpu.nvlink_gbps == 0 else _num(gpu.nvlink_gbps))
        table.add_row(
            gpu.name,
            f"{gpu.memory_gib:g}",
            f"{gib(gpu.usable_bytes):.1f}",
            _num(gpu.memory_bandwidth_gbps),
            _num(gpu.bf16_tflops)
            if gpu.bf16_tflops is not None or gpu.fp16_tflops is None
            else f"{_num(gpu.fp16_tflops)}*",
            _num(gpu.fp8_tflops),
            _num(gpu.fp32_tflops, 1),
            nvlink,
            _num(gpu.tdp_w),
            gpu.compute_capability.split(" ")[0],
        )
    return table
