"""`rentwise checkpoints DIR`: a run's checkpoints, each valid, partial or corrupt, with size and step."""

from __future__ import annotations

from pathlib import Path

import click

from rentwise.cli.render import emit_json, json_option, stdout_console
from rentwise.errors import NotFoundError
from rentwise.training.checkpoints import CheckpointInfo, list_checkpoints, read_latest


@click.command()
@click.argument("directory", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--quick", is_flag=True, help="Check file sizes only, not sha256 (fast on large checkpoints).")
@json_option
def command(directory: Path, quick: bool, as_json: bool) -> None:
    """List the checkpoints in a run's output folder; `valid` ones verify against their manifest."""
    if not directory.is_dir():
        raise NotFoundError(f"folder '{directory}' does not exist", hint="pass the run's output_dir")
    infos = list_checkpoints(directory, check_hashes=not quick)
    latest = read_latest(directory)
    if as_json:
        emit_json({"latest": latest, "checkpoints": [_record(i) for i in infos]})
        return
    console = stdout_console()
    if not infos:
        console.print(f"no checkpoints in {directory}")
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in ("checkpoint", "step", "state", "size", "note"):
        table.add_column(column, justify="right" if column in ("step", "size") else "left")
    for info in infos:
        marker = " ← latest" if info.path.name == latest else ""
        table.add_row(
            info.path.name,
            str(info.step),
            info.state,
            _format_bytes(info.size_bytes),
            (info.problem or "") + marker,
        )
    console.print(table)


def _record(info: CheckpointInfo) -> dict[str, object]:
    return {
        "name": info.path.name,
        "step": info.step,
        "state": info.state,
        "size_bytes": info.size_bytes,
        "problem": info.problem,
    }


def _format_bytes(n_bytes: int) -> str:
    """1024-based sizes (GiB = 2**30), with the unit that keeps the number readable."""
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= factor:
            return f"{n_bytes / factor:.1f} {unit}"
    return f"{n_bytes} B"
