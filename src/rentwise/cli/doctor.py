"""`rentwise doctor [--for train|inference|plan]`: is this machine usable, one line per check."""

from __future__ import annotations

from pathlib import Path

import click

from rentwise.cli.render import emit_json, json_option, stdout_console
from rentwise.machine.doctor import USES, DoctorReport, diagnose
from rentwise.machine.probe import Use, gather_inputs
from rentwise.machine.readings import open_source
from rentwise.units import parse_size

MARKS = {"ok": "[green]✓[/]", "info": "[blue]·[/]", "warn": "[yellow]⚠[/]", "fail": "[red]✗[/]", "skip": "–"}


@click.command(
    epilog="Exit code 0 when nothing is wrong for the requested use, 1 when a check fails (or warns, with "
    "--strict). --for train (the default) needs a GPU, a CUDA torch and the training packages; "
    "--for inference needs a GPU, torch and transformers; --for plan needs nothing from the machine."
)
@click.option(
    "--for",
    "use",
    type=click.Choice(USES),
    default="train",
    show_default=True,
    help="What the machine is for.",
)
@click.option(
    "--output-dir",
    type=click.Path(path_type=Path),
    default=Path("."),
    show_default=True,
    help="Where checkpoints will go (free disk is checked there).",
)
@click.option("--need-disk", metavar="SIZE", help="Free disk needed there (default: 2 x total GPU memory).")
@click.option("--strict", is_flag=True, help="Treat warnings as failures.")
@json_option
def command(use: Use, output_dir: Path, need_disk: str | None, strict: bool, as_json: bool) -> int:
    """Check driver, CUDA, torch, GPUs, memory, ECC, links, NCCL, disk, RAM and packages, with fixes."""
    need_bytes = parse_size(need_disk) if need_disk else None
    report = diagnose(gather_inputs(open_source(), output_dir, use), use, need_bytes)
    if as_json:
        emit_json({"use": report.use, "failed": report.failed, "checks": report.checks})
    else:
        render(report)
    return 1 if report.failed or (strict and report.warned) else 0


def render(report: DoctorReport) -> None:
    from rich.markup import escape

    console = stdout_console()
    console.print(f"rentwise doctor --for {report.use}")
    for check in report.checks:
        # One physical line per check (soft_wrap: the terminal wraps, rich inserts no newlines).
        line = f"{MARKS[check.status]} {check.name}: {escape(check.detail)}"
        console.print(line, markup=True, highlight=False, soft_wrap=True)
        if check.fix and check.status in ("warn", "fail", "info"):
            console.print(f"    fix: {check.fix}", markup=False, soft_wrap=True)
    verdict = "not ready" if report.failed else "ready"
    console.print(f"{verdict} for {report.use}" + (" (see ✗ above)" if report.failed else ""))
