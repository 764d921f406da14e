"""Atomic checkpoint folders: manifest, verification, resume choice, pruning, full disk."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from rentwise.errors import RentwiseError
from rentwise.training.checkpoints import (
    CheckpointWriter,
    find_resume_checkpoint,
    inspect_checkpoint,
    list_checkpoints,
    prune,
    read_latest,
    set_aside_skipped,
)


def save(root: Path, step: int, payload: bytes = b"weights", keep: int | None = None) -> Path:
    writer = CheckpointWriter(root, step)
    writer.begin()
    writer.add("trainable.safetensors", payload)
    writer.add("progress.json", json.dumps({"step": step}).encode())
    return writer.commit(keep=keep)


def test_save_writes_manifest_renames_and_moves_latest(tmp_path: Path) -> None:
    path = save(tmp_path, 12)
    assert path.name == "step-000012"
    assert not (tmp_path / "step-000012.tmp").exists()
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 12
    assert manifest["files"]["trainable.safetensors"]["size_bytes"] == len(b"weights")
    assert read_latest(tmp_path) == "step-000012"
    assert inspect_checkpoint(path).state == "valid"


def test_unfinished_save_is_partial_and_resume_uses_the_previous(tmp_path: Path) -> None:
    save(tmp_path, 1)
    writer = CheckpointWriter(tmp_path, 2)
    writer.begin()
    writer.add("trainable.safetensors", b"half")
    chosen, skipped = find_resume_checkpoint(tmp_path)
    assert chosen is not None and chosen.step == 1
    assert [(s.step, s.state) for s in skipped] == [(2, "partial")]


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("truncate", "trainable.safetensors has 3 bytes, manifest says 7"),
        ("flip", "trainable.safetensors does not match its sha256"),
        ("no-manifest", "no manifest.json"),
        ("bad-manifest", "manifest.json is unreadable"),
        ("missing-file", "trainable.safetensors is missing"),
    ],
)
def test_damaged_newest_checkpoint_is_skipped(tmp_path: Path, damage: str, problem: str) -> None:
    save(tmp_path, 1)
    newest = save(tmp_path, 2)
    weights = newest / "trainable.safetensors"
    if damage == "truncate":
        weights.write_bytes(b"wei")
    elif damage == "flip":
        weights.write_bytes(b"weightz")
    elif damage == "no-manifest":
        (newest / "manifest.json").unlink()
    elif damage == "bad-manifest":
        (newest / "manifest.json").write_text("{")
    else:
        weights.unlink()
    chosen, skipped = find_resume_checkpoint(tmp_path)
    assert chosen is not None and chosen.step == 1
    assert [s.problem for s in skipped] == [problem]
    set_aside_skipped(skipped)
    assert (tmp_path / "step-000002.corrupt").is_dir()
    save(tmp_path, 2)  # the name is free again
    assert find_resume_checkpoint(tmp_path)[0].step == 2  # type: ignore[union-attr]


def test_keep_prunes_oldest_valid_only(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save(tmp_path, step)
    (tmp_path / "step-000004.tmp").mkdir()
    assert [p.name for p in prune(tmp_path, 2)] == ["step-000001"]
    states = [(i.step, i.state) for i in list_checkpoints(tmp_path)]
    assert states == [(2, "valid"), (3, "valid"), (4, "partial")]


def test_commit_prunes_with_keep(tmp_path: Path) -> None:
    for step in range(1, 5):
        save(tmp_path, step, keep=2)
    assert [i.step for i in list_checkpoints(tmp_path)] == [3, 4]


def test_full_disk_leaves_previous_checkpoint_and_fails_clearly(tmp_path: Path) -> None:
    save(tmp_path, 5)

    def full_disk(path: Path, payload: bytes) -> str:
        path.write_bytes(payload[:1])
        raise OSError(errno.ENOSPC, "No space left on device")

    writer = CheckpointWriter(tmp_path, 6, write=full_disk)
    writer.begin()
    with pytest.raises(
        RentwiseError,
        match=r"^disk full while writing checkpoint step-000006 in '.*'; step-000005 is intact$",
    ) as caught:
        writer.add("trainable.safetensors", b"weights")
    assert caught.value.hint == "free space on that disk or lower `checkpoint.keep`, then rerun to resume"
    assert not (tmp_path / "step-000006.tmp").exists()
    assert read_latest(tmp_path) == "step-000005"
    assert [(i.step, i.state) for i in list_checkpoints(tmp_path)] == [(5, "valid")]


def test_leftover_tmp_of_the_same_step_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "step-000003.tmp").mkdir(parents=True)
    (tmp_path / "step-000003.tmp" / "junk").write_bytes(b"x")
    path = save(tmp_path, 3)
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json",
        "progress.json",
        "trainable.safetensors",
    ]


def test_files_from_other_ranks_are_hashed_at_commit(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path, 1)
    writer.begin()
    other = CheckpointWriter(tmp_path, 1)
    other.join()
    other.add("rng-rank1.pt", b"rank one")
    writer.add("rng-rank0.pt", b"rank zero")
    path = writer.commit()
    assert set(json.loads((path / "manifest.json").read_text())["files"]) == {"rng-rank0.pt", "rng-rank1.pt"}
    assert inspect_checkpoint(path).state == "valid"


def test_saving_a_step_again_replaces_it(tmp_path: Path) -> None:
    save(tmp_path, 1)
    save(tmp_path, 2, payload=b"first")
    save(tmp_path, 2, payload=b"second")  # after `--resume step-000001` the run passes step 2 again
    assert (tmp_path / "step-000002" / "trainable.safetensors").read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000001", "step-000002"]
