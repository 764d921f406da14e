"""`rentwise bench`: a short repeatable GPU benchmark against the catalog, with a verdict and reasons."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from rentwise.cli.render import emit_json, json_option, stderr_console, stdout_console
from rentwise.hardware.catalog import GpuSpec, find_gpu
from rentwise.machine.bench import QUICK, BenchConfig, run_bench
from rentwise.machine.doctor import catalog_entry
from rentwise.machine.readings import open_source
from rentwise.machine.verdict import (
    SLOWER_THAN_EXPECTED,
    BenchResult,
    Status,
    Verdict,
    judge,
    load_result,
    result_document,
)

STATUS_STYLE: dict[Status, str] = {
    "healthy": "green",
    "throttled": "yellow",
    "likely shared or noisy": "yellow",
    SLOWER_THAN_EXPECTED: "yellow",
    "not the card advertised": "red",
    "inconclusive": "blue",
}


@click.command(
    epilog="Exit code 0 when the verdict is healthy (or inconclusive: the card is not in the catalog), "
    "1 when it is throttled, likely shared or noisy, slower than expected, or not the card advertised. "
    "Peaks are the catalog's dense figures (`rentwise gpus`)."
)
@click.option("--gpu", "gpu_index", default=0, show_default=True, help="Which GPU to measure.")
@click.option(
    "--repeats", type=click.IntRange(2, 50), help="Repeats per measurement (default 5; 3 with --quick)."
)
@click.option("--quick", is_flag=True, help="Smaller sizes (4096³ matmuls, 256 MiB copies) and 3 repeats.")
@click.option(
    "--expect", metavar="GPU", help="The card you paid for (catalog name); default: what NVML reports."
)
@click.option(
    "--save", "save_path", type=click.Path(path_type=Path), help="Write the result and verdict as JSON."
)
@click.option(
    "--compare", "compare_path", type=click.Path(path_type=Path), help="An earlier --save of the same card."
)
@click.option(
    "--from",
    "from_path",
    type=click.Path(path_type=Path),
    help="Judge a saved result instead of measuring (no GPU needed).",
)
@json_option
def command(
    gpu_index: int,
    repeats: int | None,
    quick: bool,
    expect: str | None,
    save_path: Path | None,
    compare_path: Path | None,
    from_path: Path | None,
    as_json: bool,
) -> int:
    """Measure matmul TFLOPS (bf16/fp16/tf32/fp32) and memory, host and GPU-to-GPU bandwidth, K times each."""
    expected = find_gpu(expect) if expect else None
    earlier = load_result(compare_path) if compare_path else None
    if from_path:
        result = load_result(from_path)
    else:
        config = QUICK if quick else BenchConfig()
        if repeats:
            config = dataclasses.replace(config, repeats=repeats)
        progress = stderr_console()
        result = run_bench(open_source(), config, gpu_index, on_progress=lambda text: progress.print(text))
    detected = catalog_entry(result.gpu)
    spec = expected or detected
    verdict = judge(result, spec, earlier=earlier, detected=detected if expected else None)
    document = result_document(result, verdict, spec.name if spec else None)
    if save_path:
        save_path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    if as_json:
        emit_json(document)
    else:
        render(result, verdict, spec)
    if save_path:
        stderr_console().print(f"saved to {save_path}")
    return 0 if verdict.status in ("healthy", "inconclusive") else 1


def render(result: BenchResult, verdict: Verdict, spec: GpuSpec | None) -> None:
    from rich.table import Table

    console = stdout_console()
    catalog = f" = catalog '{spec.name}'" if spec else " (not in the catalog)"
    built = f", torch {result.torch_version} (CUDA {result.cuda_build})" if result.torch_version else ""
    console.print(f"GPU {result.gpu.index}: {result.gpu.name}{catalog}{built}", markup=False)
    table = Table(box=None)
    for header in ("measurement", "median", "spread", "catalog peak", "% of peak", "normal ≥"):
        table.add_column(header, justify="left" if header == "measurement" else "right")
    for c in verdict.comparisons:
        table.add_row(
            c.name,
            f"{c.achieved:,.1f} {c.unit}",
            f"{c.spread:.1%}",
            f"{c.peak:,.0f}" if c.peak else "-",
            f"{c.fraction:.0%}" if c.fraction is not None else "-",
            f"{c.normal_fraction:.0%}" if c.normal_fraction is not None else "-",
        )
    console.print(table)
    _render_conditions(result)
    style = STATUS_STYLE[verdict.status]
    console.print(f"verdict: [{style}]{verdict.status}[/]", markup=True)
    for reason in verdict.reasons:
        console.print(f"  - {reason}", markup=False, soft_wrap=True)


def _render_conditions(result: BenchResult) -> None:
    """Clocks, power and slowdown reasons seen by NVML during the run."""
    readings = [r for s in result.samples for r in s.gpus if r.index == result.gpu.index]
    if not readings:
        stdout_console().print("conditions: no NVML samples during the run (NVML unavailable)")
        return
    clocks = [r.sm_clock_mhz for r in readings if r.sm_clock_mhz]
    powers = [r.power_w for r in readings if r.power_w is not None]
    limit = next((r.power_limit_w for r in readings if r.power_limit_w), None)
    hottest = max((r.temperature_c for r in readings if r.temperature_c is not None), default=None)
    reasons = sorted({name for r in readings for name in r.slowdown_reasons()})
    parts = [f"{len(readings)} NVML samples"]
    if clocks:
        top = f" (max {result.gpu.max_sm_clock_mhz:.0f})" if result.gpu.max_sm_clock_mhz else ""
        parts.append(f"SM clock {min(clocks):.0f}-{max(clocks):.0f} MHz{top}")
    if powers:
        parts.append(f"power up to {max(powers):.0f} W" + (f" of {limit:.0f} W limit" if limit else ""))
    if hottest is not None:
        parts.append(f"up to {hottest:.0f} °C")
    parts.append(f"slowdowns: {', '.join(reasons) or 'none'}")
    stdout_console().print("conditions: " + "; ".join(parts), markup=False)
