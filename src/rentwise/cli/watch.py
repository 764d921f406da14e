"""`rentwise watch [--interval S] [-- CMD ...]`: live GPU view with advice, and a summary at the end."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from rentwise.cli.job_options import job_from_options, job_options
from rentwise.cli.render import emit_json, json_option, stderr_console, stdout_console
from rentwise.errors import ConfigError, RentwiseError
from rentwise.machine.advice import Advice, AdviceContext, MicroBatchModel
from rentwise.machine.readings import GpuSource, Sample, TraceSource, open_source
from rentwise.machine.watch import WatchRun, WatchSummary
from rentwise.units import format_duration, format_gib

SEVERITY_MARK = {"critical": "✗", "warn": "⚠", "info": "•"}


@click.command(
    context_settings={"ignore_unknown_options": False},
    epilog="Exit code: the command's own exit code when one is given (128+N if it died of signal N); "
    "otherwise 0, or 1 when a GPU was lost. Traces are JSON Lines (a header, then one sample per line).",
)
@click.option("--interval", "interval_s", default=2.0, show_default=True, help="Seconds between readings.")
@click.option(
    "--record", "record_path", type=click.Path(path_type=Path), help="Write every sample to this file."
)
@click.option(
    "--replay",
    "replay_path",
    type=click.Path(path_type=Path),
    help="Read samples from a recorded trace instead of the GPUs (no waiting).",
)
@click.option(
    "--duration", "duration_s", type=float, help="Stop after this many seconds (without a command)."
)
@click.option(
    "--job",
    "job_model",
    metavar="MODEL",
    help="The model being trained; with the memory flags below (as for `rentwise memory`) the "
    "'raise the micro-batch' advice says by how much.",
)
@job_options
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD ...]")
def command(
    interval_s: float,
    record_path: Path | None,
    replay_path: Path | None,
    duration_s: float | None,
    as_json: bool,
    command: tuple[str, ...],
    job_model: str | None,
    **job_flags: Any,
) -> int:
    """Watch each GPU's memory, utilisation, power, temperature and clocks, and turn them into advice.

    With a command, run it, follow its process tree and summarise the run when it ends (the samples are
    written to --record, by default rentwise-watch-<time>.jsonl).
    """
    if interval_s <= 0:
        raise ConfigError(f"--interval must be positive, got {interval_s}", hint="e.g. --interval 2")
    if duration_s is not None and command:
        raise ConfigError(
            "--duration stops a plain watch; with a command, watch ends when it does", hint="drop --duration"
        )
    if replay_path and command:
        raise ConfigError(
            "--replay reads a finished recording; it cannot run a command", hint="drop one of them"
        )
    source = _source(replay_path)
    if command and record_path is None:
        record_path = Path(f"rentwise-watch-{dt.datetime.now():%Y%m%d-%H%M%S}.jsonl")
    live = _LiveView() if (sys.stderr.isatty() and not replay_path and not as_json) else None
    run = WatchRun(
        source=source,
        interval_s=interval_s,
        command=command,
        record_path=record_path,
        host=_host_sampler() if not replay_path else None,
        context=AdviceContext(micro_batch_model=_micro_batch_model(job_model, job_flags)),
        max_duration_s=duration_s,
        on_update=live.update if live else None,
        sleep=(lambda _: None) if replay_path else _sleep,
        process_tree=_process_tree() if command else None,
    )
    try:
        summary = run.run()
    finally:
        if live:
            live.stop()
    _render(summary, as_json)
    return _exit_code(summary)


def _source(replay_path: Path | None) -> GpuSource:
    if replay_path:
        return TraceSource.from_file(replay_path)
    source = open_source()
    reason = source.facts().unavailable
    if reason:
        raise RentwiseError(
            f"cannot watch GPUs: {reason}",
            hint="`rentwise doctor` explains the machine; `rentwise watch --replay FILE` replays a trace",
        )
    return source


def _micro_batch_model(job_model: str | None, job_flags: dict[str, Any]) -> MicroBatchModel | None:
    """How the watched job's memory grows per sample, from the analytic estimator (`rentwise memory`)."""
    if job_model is None:
        return None
    from rentwise.machine.advice import micro_batch_model_for
    from rentwise.models.catalog import load_shape

    return micro_batch_model_for(load_shape(job_model), job_from_options(job_flags))


def _host_sampler() -> Any:
    from rentwise.machine.host import HostSampler

    return HostSampler()


def _process_tree() -> Any:
    from rentwise.machine.host import process_tree

    return process_tree


def _sleep(seconds: float) -> None:
    import time

    time.sleep(seconds)


def _exit_code(summary: WatchSummary) -> int:
    if summary.interrupted:
        return 130
    if summary.exit_code is not None:
        return summary.exit_code
    return 1 if summary.lost_gpus else 0


# ---------------------------------------------------------------------------------------------------------
# Rendering


def gpu_rows(sample: Sample) -> list[tuple[str, ...]]:
    """One row per GPU of a sample: index, memory, util, power, temperature, SM clock, slowdowns."""
    rows: list[tuple[str, ...]] = []
    for r in sample.gpus:
        power = (
            f"{r.power_w:.0f}/{r.power_limit_w:.0f} W" if r.power_w is not None and r.power_limit_w else "-"
        )
        rows.append(
            (
                str(r.index),
                f"{format_gib(r.memory_used_bytes, 1)} / {format_gib(r.memory_total_bytes, 1)} "
                f"({r.memory_used_fraction:.0%})",
                f"{r.utilization_pct:.0f}%" if r.utilization_pct is not None else "-",
                power,
                f"{r.temperature_c:.0f} °C" if r.temperature_c is not None else "-",
                f"{r.sm_clock_mhz:.0f} MHz" if r.sm_clock_mhz is not None else "-",
                ", ".join(r.slowdown_reasons()) or "-",
            )
        )
    return rows


def advice_lines(advice: Sequence[Advice]) -> list[str]:
    return [f"{SEVERITY_MARK[a.severity]} {a.message}\n    → {a.action}" for a in advice]


class _LiveView:
    """The rich live table on stderr, redrawn after each sample."""

    def __init__(self) -> None:
        from rich.live import Live

        self._live = Live(console=stderr_console(), auto_refresh=False, transient=False)
        self._live.start()

    def update(self, samples: Sequence[Sample], advice: list[Advice]) -> None:
        from rich.console import Group
        from rich.table import Table

        sample = samples[-1]
        table = Table(title=f"rentwise watch  t={format_duration(sample.t_s)}", title_justify="left")
        for header in ("GPU", "memory", "util", "power", "temp", "SM clock", "slowdown"):
            table.add_column(header)
        for row in gpu_rows(sample):
            table.add_row(*row)
        parts: list[Any] = [table]
        if sample.host:
            h = sample.host
            parts.append(
                f"host: CPU {h.cpu_pct:.0f}%  RAM {format_gib(h.ram_used_bytes, 1)} / "
                f"{format_gib(h.ram_total_bytes, 1)}  disk read {h.disk_read_bytes_per_s / 1e6:.0f} MB/s "
                f"write {h.disk_write_bytes_per_s / 1e6:.0f} MB/s"
            )
        if sample.lost_gpus:
            parts.append(f"lost GPUs: {', '.join(str(i) for i in sample.lost_gpus)}")
        parts.extend(advice_lines(advice))
        self._live.update(Group(*parts), refresh=True)

    def stop(self) -> None:
        self._live.stop()


def _render(summary: WatchSummary, as_json: bool) -> None:
    if as_json:
        emit_json(summary)
        return
    from rich.table import Table

    console = stdout_console()
    heading = f"watched {format_duration(summary.duration_s)}, {summary.sample_count} samples"
    if summary.command:
        heading += f"; `{' '.join(summary.command)}` exited with code {summary.exit_code}"
    if summary.interrupted:
        heading += " (interrupted)"
    console.print(heading)
    if summary.note:
        console.print(f"note: {summary.note}")
    if summary.gpus:
        table = Table(box=None, title_justify="left")
        for header in (
            "GPU",
            "name",
            "peak memory",
            "job peak",
            "mean util",
            "idle",
            "throttled",
            "max temp",
        ):
            table.add_column(header)
        for g in summary.gpus:
            table.add_row(
                str(g.index),
                g.name,
                f"{format_gib(g.peak_used_bytes, 1)} / {format_gib(g.total_bytes, 1)}",
                format_gib(g.job_peak_bytes, 1) if g.job_peak_bytes is not None else "-",
                f"{g.mean_utilization_pct:.0f}%" if g.mean_utilization_pct is not None else "-",
                format_duration(g.idle_s),
                format_duration(g.throttled_s),
                f"{g.max_temperature_c:.0f} °C" if g.max_temperature_c is not None else "-",
            )
        console.print(table)
    for line in advice_lines(summary.advice) or ["no advice: nothing in the readings crossed a threshold"]:
        console.print(line, markup=False, soft_wrap=True)
    if summary.trace_path:
        stderr_console().print(f"samples written to {summary.trace_path}")
