"""Atomic checkpoint folders: manifest, verification, resume choice, pruning, full disk."""

from __future__ import annotations

import errno
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rentwise.errors import RentwiseError
from rentwise.training import checkpoints
from rentwise.training.checkpoints import (
    HASH_CHUNK_BYTES,
    CheckpointWriter,
    chunk_sha256,
    file_chunk_sha256,
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

    def full_disk(path: Path, payload: bytes) -> list[str]:
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


CHUNK = 1000  # a small chunk size for these tests, so a payload of a few kB has many chunks


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoints, "HASH_CHUNK_BYTES", CHUNK)
    monkeypatch.setattr(checkpoints, "INLINE_HASH_BYTES", 0)  # hash in the thread pool, as large files do


def pattern(size: int) -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(size))


def manifest_of(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((path / "manifest.json").read_text())


def test_manifest_holds_the_sha256_of_every_chunk(tmp_path: Path, small_chunks: None) -> None:
    payload = pattern(3 * CHUNK + 17)
    entry = manifest_of(save(tmp_path, 1, payload))["files"]["trainable.safetensors"]
    assert entry["size_bytes"] == len(payload)
    assert entry["chunk_bytes"] == CHUNK
    assert entry["sha256_chunks"] == [
        hashlib.sha256(payload[start : start + CHUNK]).hexdigest() for start in range(0, len(payload), CHUNK)
    ]
    assert manifest_of(tmp_path / "step-000001")["format"] == 2


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK, 5 * CHUNK + 3])
def test_file_chunk_hashes_equal_the_payload_chunk_hashes(tmp_path: Path, size: int) -> None:
    payload = pattern(size)
    (tmp_path / "f").write_bytes(payload)
    expected = chunk_sha256(payload, CHUNK)
    assert len(expected) == max(1, -(-size // CHUNK))
    assert file_chunk_sha256(tmp_path / "f", CHUNK) == expected
    assert expected[0] == hashlib.sha256(payload[:CHUNK]).hexdigest()


@pytest.mark.parametrize("offset", [0, CHUNK - 1, CHUNK, 2 * CHUNK + 500, 4 * CHUNK + 16])
def test_a_flipped_byte_in_any_chunk_is_found(tmp_path: Path, small_chunks: None, offset: int) -> None:
    save(tmp_path, 1)
    newest = save(tmp_path, 2, pattern(4 * CHUNK + 17))
    weights = newest / "trainable.safetensors"
    damaged = bytearray(weights.read_bytes())
    damaged[offset] ^= 0x01
    weights.write_bytes(bytes(damaged))
    info = inspect_checkpoint(newest)
    assert (info.state, info.problem) == ("corrupt", "trainable.safetensors does not match its sha256")
    assert inspect_checkpoint(newest, check_hashes=False).state == "valid"  # same size: only hashes see it
    assert find_resume_checkpoint(tmp_path)[0].step == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("cut", [1, 17, CHUNK + 17])
def test_a_truncated_file_is_found(tmp_path: Path, small_chunks: None, cut: int) -> None:
    newest = save(tmp_path, 2, pattern(4 * CHUNK + 17))
    weights = newest / "trainable.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:-cut])
    info = inspect_checkpoint(newest, check_hashes=False)
    assert (info.state, info.problem) == (
        "corrupt",
        f"trainable.safetensors has {size - cut} bytes, manifest says {size}",
    )


@pytest.mark.parametrize("edit", ["size-also-cut", "digest-dropped", "chunk-size", "chunk-size-type"])
def test_a_manifest_that_disagrees_with_the_file_fails(tmp_path: Path, small_chunks: None, edit: str) -> None:
    newest = save(tmp_path, 2, pattern(4 * CHUNK + 17))
    manifest = manifest_of(newest)
    entry = manifest["files"]["trainable.safetensors"]
    weights = newest / "trainable.safetensors"
    if edit == "size-also-cut":  # a file cut at a chunk boundary, with a size that agrees: the count does not
        weights.write_bytes(weights.read_bytes()[: 4 * CHUNK])
        entry["size_bytes"] = 4 * CHUNK
    elif edit == "digest-dropped":
        entry["sha256_chunks"] = entry["sha256_chunks"][:-1]
    elif edit == "chunk-size":
        entry["chunk_bytes"] = 2 * CHUNK
    else:
        entry["chunk_bytes"] = str(CHUNK)
    (newest / "manifest.json").write_text(json.dumps(manifest))
    info = inspect_checkpoint(newest)
    assert (info.state, info.problem) == ("corrupt", "trainable.safetensors does not match its sha256")


def test_default_chunk_size_finds_a_flip_in_the_last_chunk(tmp_path: Path) -> None:
    payload = pattern(256) * (2 * HASH_CHUNK_BYTES // 256) + b"tail"  # three chunks of the real size
    newest = save(tmp_path, 1, payload)
    assert len(manifest_of(newest)["files"]["trainable.safetensors"]["sha256_chunks"]) == 3
    assert inspect_checkpoint(newest).state == "valid"
    with open(newest / "trainable.safetensors", "r+b") as handle:
        handle.seek(len(payload) - 2)
        handle.write(b"X")
    assert inspect_checkpoint(newest).problem == "trainable.safetensors does not match its sha256"


def test_format_1_manifests_are_still_verified(tmp_path: Path) -> None:
    newest = save(tmp_path, 1, b"weights")
    manifest = manifest_of(newest)
    manifest["format"] = 1
    for name, entry in manifest["files"].items():
        del entry["chunk_bytes"], entry["sha256_chunks"]
        entry["sha256"] = hashlib.sha256((newest / name).read_bytes()).hexdigest()
    (newest / "manifest.json").write_text(json.dumps(manifest))
    assert inspect_checkpoint(newest).state == "valid"
    (newest / "trainable.safetensors").write_bytes(b"weightz")
    assert inspect_checkpoint(newest).problem == "trainable.safetensors does not match its sha256"


def test_an_unknown_manifest_format_is_not_trusted(tmp_path: Path) -> None:
    newest = save(tmp_path, 1)
    manifest = manifest_of(newest)
    manifest["format"] = 3
    (newest / "manifest.json").write_text(json.dumps(manifest))
    info = inspect_checkpoint(newest)
    assert info.state == "corrupt"
    assert info.problem is not None and info.problem.startswith("manifest format 3 is not one rentwise")


def test_large_files_from_other_ranks_are_hashed_in_chunks_at_commit(
    tmp_path: Path, small_chunks: None
) -> None:
    payload = pattern(3 * CHUNK + 1)
    writer = CheckpointWriter(tmp_path, 1)
    writer.begin()
    (tmp_path / "step-000001.tmp" / "rng-rank1.pt").write_bytes(payload)  # as another rank leaves it
    path = writer.commit()
    entry = manifest_of(path)["files"]["rng-rank1.pt"]
    assert entry["sha256_chunks"] == chunk_sha256(payload, CHUNK)
    assert inspect_checkpoint(path).state == "valid"


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("flip-middle-chunk", "trainable.safetensors does not match its sha256"),
        ("truncate", "trainable.safetensors has 2500 bytes, manifest says 3017"),
    ],
)
def test_rentwise_checkpoints_reports_damage_in_any_chunk(
    run_cli: Callable[..., Any], tmp_path: Path, small_chunks: None, damage: str, problem: str
) -> None:
    save(tmp_path, 1)
    weights = save(tmp_path, 2, pattern(3 * CHUNK + 17)) / "trainable.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "truncate":
        del data[2500:]
    else:
        data[CHUNK + 10] ^= 0x80
    weights.write_bytes(bytes(data))
    report = json.loads(run_cli("checkpoints", str(tmp_path), "--json").stdout)
    assert [(c["name"], c["state"], c["problem"]) for c in report["checkpoints"]] == [
        ("step-000001", "valid", None),
        ("step-000002", "corrupt", problem),
    ]


@pytest.mark.parametrize("cores", [1, 2, 3, 64])
def test_write_synced_hashes_every_chunk_on_any_core_count(
    tmp_path: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch, cores: int
) -> None:
    monkeypatch.setattr(checkpoints, "_cores", lambda: cores)
    payload = pattern(7 * CHUNK + 3)
    assert checkpoints.write_synced(tmp_path / "f", payload) == chunk_sha256(payload, CHUNK)
    assert (tmp_path / "f").read_bytes() == payload


def test_write_synced_raises_a_failed_write_after_the_hash_threads_end(
    tmp_path: Path, small_chunks: None
) -> None:
    (tmp_path / "f").write_bytes(b"there already")
    with pytest.raises(FileExistsError):
        checkpoints.write_synced(tmp_path / "f", pattern(5 * CHUNK))
    assert (tmp_path / "f").read_bytes() == b"there already"
