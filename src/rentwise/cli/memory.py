"""`rentwise memory MODEL`: the peak-memory breakdown, the GPUs it fits on, and what it leaves out."""

from __future__ import annotations

from typing import Any

import click

from rentwise.cli.job_options import job_from_options, job_options
from rentwise.cli.render import emit_json, json_option, plain_table, to_jsonable, warn
from rentwise.hardware.catalog import GpuSpec, find_gpu, load_gpus
from rentwise.memory.breakdown import MemoryBreakdown
from rentwise.memory.estimate import effective_job, estimate_memory
from rentwise.memory.fit import GpuFit, fit_on_gpus
from rentwise.memory.job import MemoryJob
from rentwise.models.catalog import load_shape
from rentwise.models.shape import ModelShape
from rentwise.trace.result import TraceResult
from rentwise.units import GIB, format_count


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model")
@job_options
@click.option("--gpu", "gpu_names", multiple=True, help="Only show fit on these GPUs (repeatable).")
@click.option(
    "--trace",
    is_flag=True,
    help="Also run one real step of the real model on fake tensors (needs rentwise[trace]) and show it "
    "next to the analytic answer; the first --gpu (default H100) sets the attention kernel and allocator.",
)
@json_option
def command(model: str, gpu_names: tuple[str, ...], trace: bool, as_json: bool, **options: Any) -> int:
    """Peak GPU memory per device for MODEL (a bundled name, a config.json or a model folder).

    Example: rentwise memory qwen2.5-7b --method lora --seq 2048 --batch 1 --grad-ckpt
    """
    job = job_from_options(options)
    shape = load_shape(model)
    _check_against_shape(shape, job)
    used = effective_job(shape, job)
    if used.attention != job.attention:
        warn(f"{shape.name} has no {job.attention} attention in transformers; estimating {used.attention} "
             "(use --attention flash for flash-attention-2)")  # fmt: skip
    breakdown = estimate_memory(shape, job)
    gpus = [find_gpu(name) for name in gpu_names] if gpu_names else list(load_gpus())
    fits = fit_on_gpus(shape, job, breakdown, gpus)
    traced = _trace(shape, job, gpus[0] if gpu_names else find_gpu("H100")) if trace else None
    if as_json:
        payload = _as_dict(shape, job, breakdown, fits)
        if traced is not None:
            payload["trace"] = traced.to_dict()
        emit_json(payload)
    else:
        _render(shape, job, breakdown, fits)
        if traced is not None:
            click.echo("")
            click.echo(_trace_comparison(breakdown, traced))
    return 0 if any(f.fits for f in fits) or not gpu_names else 1


def _trace(shape: ModelShape, job: MemoryJob, gpu: GpuSpec) -> TraceResult:
    """Run the fake-tensor trace with a spinner on stderr (tracing an 8B model takes seconds)."""
    from rentwise.errors import require_extra

    require_extra("torch", "trace")
    from rentwise.cli.render import stderr_console
    from rentwise.trace import target_from_gpu, trace_memory

    target = target_from_gpu(gpu.name, gpu.compute_capability, gpu.usable_bytes)
    with stderr_console().status(f"tracing one step of {shape.name} on fake tensors ({gpu.name})") as status:
        return trace_memory(shape, job, target=target, progress=lambda msg: status.update(f"tracing: {msg}"))


def _trace_comparison(analytic: MemoryBreakdown, traced: TraceResult) -> str:
    """The traced breakdown next to the analytic one, line by line, with the difference."""
    t = traced.breakdown
    rows = []
    for name, label, value in analytic.components():
        other = int(getattr(t, name))
        if value or other:
            rows.append([label, _gib(value), _gib(other), _diff(value, other)])
    for label, a, b in (
        ("allocated", analytic.allocated_bytes, t.allocated_bytes),
        ("reserved", analytic.reserved_bytes, t.reserved_bytes),
        ("total per GPU (nvidia-smi)", analytic.total_bytes, t.total_bytes),
    ):
        rows.append([label, _gib(a), _gib(b), _diff(a, b)])
    table = plain_table(["component", "analytic GiB", "trace GiB", "analytic - trace"], rows,
                        right=[False, True, True, True])  # fmt: skip
    notes = [
        f"trace: peak at {traced.peak_phase.replace('_', ' ')} in '{traced.peak_module or '(top level)'}', "
        f"target {traced.target}, {traced.elapsed_s:.1f} s",
    ]
    if traced.top_modules:
        top = ", ".join(f"{name} {_gib(size)}" for name, size in traced.top_modules[:5])
        notes.append(f"trace: most memory at the peak (GiB): {top}")
    notes += [f"trace: {note}" for note in traced.notes]
    return "\n".join([table, *notes])


def _diff(analytic: int, traced: int) -> str:
    if abs(analytic - traced) < 2**20:  # under 1 MiB: nothing worth a percentage
        return "0.00"
    if not traced:
        return "+" + _gib(analytic)
    return f"{(analytic - traced) / 2**30:+,.2f} ({100 * (analytic - traced) / traced:+.1f}%)"


def _check_against_shape(shape: ModelShape, job: MemoryJob) -> None:
    from rentwise.errors import ConfigError

    problems = []
    if job.uses_adapter and job.lora_rank > shape.hidden_size:
        problems.append(f"lora-rank {job.lora_rank} is larger than the hidden size {shape.hidden_size}")
    if job.tensor_parallel > 1 and shape.num_kv_heads % job.tensor_parallel:
        problems.append(
            f"tensor-parallel {job.tensor_parallel} does not divide the {shape.num_kv_heads} key/value heads"
        )
    if job.uses_adapter:
        from rentwise.memory.activations import lora_target_names

        if not lora_target_names(shape, job):
            known = ", ".join(sorted({lin.name.split(".")[-1] for lin in shape.layer_linears()}))
            problems.append(f"lora-targets '{','.join(job.lora_targets)}' match no layer (known: {known})")
    if problems:
        raise ConfigError("; ".join(problems), hint="run `rentwise memory --help` for the valid options")


def _as_dict(shape: ModelShape, job: MemoryJob, b: MemoryBreakdown, fits: list[GpuFit]) -> dict[str, Any]:
    return {
        "model": shape.name,
        "params": shape.num_params,
        "active_params": shape.num_active_params,
        "job": to_jsonable(job),
        "breakdown": to_jsonable(b),
        "allocated_bytes": b.allocated_bytes,
        "reserved_bytes": b.reserved_bytes,
        "total_bytes": b.total_bytes,
        "fits": [{**to_jsonable(f), "headroom_bytes": f.headroom_bytes} for f in fits],
    }


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f}"


def _describe(shape: ModelShape, job: MemoryJob) -> str:
    parts: list[str] = [job.method, job.precision]
    if job.is_training:
        parts.append(job.optimizer)
    if job.uses_adapter:
        parts.append(f"rank {job.lora_rank} on {','.join(job.lora_targets)}")
    if job.is_training:
        parts += [f"micro-batch {job.micro_batch}", f"seq {job.seq_len}"]
        if job.grad_checkpointing:
            parts.append("grad checkpointing")
    else:
        parts += [f"batch {job.micro_batch}", f"prompt {job.prompt_len}", f"generate {job.generate_len}"]
    parts.append(f"{job.attention} attention")
    if job.num_gpus > 1:
        parts.append(f"{job.num_gpus} GPUs {job.sharding}")
    params = format_count(shape.num_params)
    if shape.is_moe:
        params += f" ({format_count(shape.num_active_params)} active)"
    return f"{shape.name} · {params} params · " + " · ".join(parts)


def _render(shape: ModelShape, job: MemoryJob, b: MemoryBreakdown, fits: list[GpuFit]) -> None:
    lines = [_describe(shape, job), ""]
    rows = [
        [label, _gib(value), f"{100 * value / b.total_bytes:.0f}%"]
        for _, label, value in b.components()
        if value
    ]
    rows += [
        ["allocated (max_memory_allocated)", _gib(b.allocated_bytes), ""],
        ["reserved (max_memory_reserved)", _gib(b.reserved_bytes), ""],
        ["total per GPU (nvidia-smi)", _gib(b.total_bytes), ""],
    ]
    lines.append(plain_table(["component", "GiB", "share"], rows, right=[False, True, True]))
    lines.append(f"peak at: {b.peak_phase.replace('_', ' ')}" + ("" if job.num_gpus == 1 else " (per GPU)"))
    lines.append("")
    lines += _fit_lines(fits)
    lines.append("")
    lines.append("leaves out: " + "; ".join(b.leaves_out))
    click.echo("\n".join(lines))


def _fit_lines(fits: list[GpuFit], shown: int = 8) -> list[str]:
    fitting = [f for f in fits if f.fits]
    lines: list[str] = []
    if fitting:
        rows = [[f.gpu, _gib(f.usable_bytes), _gib(f.headroom_bytes)] for f in fitting[:shown]]
        lines += ["fits on (smallest first):", plain_table(["GPU", "usable GiB", "headroom GiB"], rows,
                                                           right=[False, True, True], indent=2)]  # fmt: skip
        if len(fitting) > shown:
            lines.append(
                f"  ... and {len(fitting) - shown} larger GPUs (--json lists all, --gpu NAME checks one)"
            )
    scaled = [f for f in fits if not f.fits and f.gpu_count > 1]
    if scaled:
        rows = [[f.gpu, str(f.gpu_count), f.strategy, _gib(f.needed_bytes)] for f in scaled]
        lines += ["needs several of:", plain_table(["GPU", "cards", "strategy", "GiB/GPU"], rows,
                                                   right=[False, True, False, True], indent=2)]  # fmt: skip
    if not fitting and not scaled:
        lines.append("fits on no GPU in the catalog, even on 64 cards")
    return lines
