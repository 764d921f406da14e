"""A disk that fills up during a save: the run stops with a clear error, the previous checkpoint stays valid,
and the next run resumes from it."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from rentwise.errors import RentwiseError
from rentwise.training.checkpoints import list_checkpoints, read_latest, write_synced
from rentwise.training.config import load_config
from rentwise.training.runner import RunOptions, train

from .conftest import write_tiny_run


class DiskFullAfter:
    """Checkpoint file writer that works for `files` files, then writes half a file and raises ENOSPC."""

    def __init__(self, files: int) -> None:
        self.left = files

    def __call__(self, path: Path, payload: bytes) -> list[str]:
        self.left -= 1
        if self.left < 0:
            path.write_bytes(payload[: len(payload) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_synced(path, payload)


def test_disk_full_during_a_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    config = load_config(write_tiny_run(tmp_path, max_steps=6))  # saves at steps 3 and 6
    full_disk = DiskFullAfter(files=7 + 3)  # the 6 files and the manifest of step 3, then 3 files of step 6
    with pytest.raises(RentwiseError) as caught:
        train(config, RunOptions(show_progress=False, write_file=full_disk))
    out = config.output_dir
    assert (
        caught.value.message
        == f"disk full while writing checkpoint step-000006 in '{out}'; step-000003 is intact"
    )
    assert [(i.step, i.state) for i in list_checkpoints(out)] == [(3, "valid")]
    assert read_latest(out) == "step-000003"
    assert train(config, RunOptions(show_progress=False)).resumed_from == 3
