"""Checkpoints that cannot be half-written: write into `step-NNNNNN.tmp/`, fsync, manifest, rename, pointer.

The order of a save (each step is durable before the next begins):
  1. every file is written into `step-NNNNNN.tmp/` and fsynced; its size and the sha256 of each 16 MiB
     chunk are recorded (the chunks are hashed in parallel threads while the file is written);
  2. `manifest.json` (sizes and chunk hashes of every other file) is written last and fsynced, then the
     folder;
  3. the folder is renamed to `step-NNNNNN/` (atomic on POSIX) and the parent folder is fsynced;
  4. only then is the `latest` pointer replaced (write `latest.tmp`, fsync, `os.replace`, fsync the parent).
A kill at any instant leaves either a `.tmp` folder (partial, ignored) or a complete checkpoint. Resume does
not trust the pointer: it verifies manifests newest first and skips partial and corrupt checkpoints.
This module is plain Python (no torch): payloads arrive as bytes.

Manifest format 2 (this version) records per file `size_bytes`, `chunk_bytes` and `sha256_chunks`: the
sha256 of bytes [i * chunk_bytes, (i + 1) * chunk_bytes) for each i, one digest for an empty file. One sha256
over a whole file runs on one core (~1 GB/s), slower than a local disk write; chunks hash on every core, on
save and on verify. Any changed byte changes its chunk's digest; sizes catch truncation. Format 1 manifests
(one `sha256` of the whole file) are still verified. Code that reads only format 1 would call format 2
checkpoints corrupt.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from rentwise import __version__
from rentwise.errors import RentwiseError

MANIFEST_NAME = "manifest.json"
LATEST_NAME = "latest"
MANIFEST_FORMAT = 2
READABLE_FORMATS = (1, 2)
HASH_CHUNK_BYTES = 16 * 2**20  # one sha256 per 16 MiB of a file (format 2); the manifest records the size
READ_BYTES = 8 * 2**20  # read files in 8 MiB pieces
INLINE_HASH_BYTES = 2**20  # below this a payload is hashed in the calling thread (threads cost more)
MAX_HASH_THREADS = 32

CheckpointState = Literal["valid", "partial", "corrupt"]
FileWriter = Callable[[Path, bytes], list[str]]
"""Write bytes to a new file durably and return `chunk_sha256(payload)` (a seam: tests inject a full disk)."""

_T = TypeVar("_T")
_NAME = re.compile(r"^step-(\d{6,})(\.tmp|\.corrupt)?$")


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint folder as found on disk."""

    path: Path
    step: int
    state: CheckpointState
    size_bytes: int
    problem: str | None = None  # why it is partial or corrupt


def checkpoint_name(step: int) -> str:
    """Return the folder name of the checkpoint after `step` optimizer steps: `step-000120`."""
    return f"step-{step:06d}"


def write_synced(path: Path, payload: bytes) -> list[str]:
    """Write `payload` to a new file, fsync it, and return the sha256 of each chunk (as `chunk_sha256`).

    The chunks are hashed in a thread pool while this thread writes and waits for fsync (hashlib and file
    writes release the GIL). While this thread copies the payload into the page cache, the hash threads use
    the other cores only: taking turns with the copy on its core slowed the whole save (2-core benchmark,
    70% of a raw write instead of 90%). fsync waits on the disk, so then every core hashes.
    """
    if len(payload) < INLINE_HASH_BYTES:
        digests = chunk_sha256(payload)
        _write_and_fsync(path, payload)
        return digests
    view = memoryview(payload)
    spans = chunk_spans(len(payload), HASH_CHUNK_BYTES)
    threads = _hash_threads(len(spans))
    while_copying = max(1, min(threads, _cores() - 1))
    gate = threading.Semaphore(while_copying)

    def digest(span: tuple[int, int]) -> str:
        with gate:
            return _sha256_view(view[span[0] : span[1]])

    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending = [pool.submit(digest, span) for span in spans]
        with open(path, "xb") as handle:
            handle.write(payload)
            handle.flush()
            if threads > while_copying:
                gate.release(threads - while_copying)
            os.fsync(handle.fileno())
        return [future.result() for future in pending]


def chunk_spans(size: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """The [start, end) byte ranges of the chunks of a `size`-byte file; one empty chunk when `size` is 0."""
    if size == 0:
        return [(0, 0)]
    return [(start, min(start + chunk_bytes, size)) for start in range(0, size, chunk_bytes)]


def chunk_sha256(payload: bytes, chunk_bytes: int = HASH_CHUNK_BYTES) -> list[str]:
    """The sha256 hex digest of each `chunk_bytes` chunk of `payload` (in the calling thread)."""
    view = memoryview(payload)
    return [_sha256_view(view[start:end]) for start, end in chunk_spans(len(payload), chunk_bytes)]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _hash_threads(chunks: int) -> int:
    return max(1, min(chunks, _cores(), MAX_HASH_THREADS))


def _write_and_fsync(path: Path, payload: bytes) -> None:
    with open(path, "xb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())


def _sha256_view(view: memoryview) -> str:
    digest = hashlib.sha256()
    for start in range(0, len(view), READ_BYTES):
        digest.update(view[start : start + READ_BYTES])
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """fsync a folder so a create or rename inside it survives a power cut (POSIX; a no-op elsewhere)."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    """Return the sha256 hex digest of a whole file, read in pieces (format 1 manifests)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while piece := handle.read(READ_BYTES):
            digest.update(piece)
    return digest.hexdigest()


def file_chunk_sha256(path: Path, chunk_bytes: int = HASH_CHUNK_BYTES) -> list[str]:
    """The sha256 hex digest of each `chunk_bytes` chunk of a file, read and hashed in parallel threads."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        spans = chunk_spans(os.fstat(fd).st_size, chunk_bytes)

        def digest(span: tuple[int, int]) -> str:
            sha = hashlib.sha256()
            for start in range(span[0], span[1], READ_BYTES):
                piece = os.pread(fd, min(READ_BYTES, span[1] - start), start)
                if not piece:  # the file shrank while being read
                    break
                sha.update(piece)
            return sha.hexdigest()

        if len(spans) == 1:
            return [digest(spans[0])]
        with ThreadPoolExecutor(max_workers=_hash_threads(len(spans))) as pool:
            return list(pool.map(digest, spans))
    finally:
        os.close(fd)


class CheckpointWriter:
    """One save in progress: files go into `step-NNNNNN.tmp/` until `commit()` renames the folder.

    In a multi-process run every rank adds its own files (its RNG state) to the same folder; rank 0 commits
    after a barrier and hashes the files other ranks wrote.
    """

    def __init__(
        self, root: Path, step: int, *, pause_s: float = 0.0, write: FileWriter = write_synced
    ) -> None:
        self.root = root
        self.step = step
        self.final_path = root / checkpoint_name(step)
        self.tmp_path = root / (checkpoint_name(step) + ".tmp")
        self._pause_s = pause_s  # test seam: sleep after each file so a kill can land mid-save
        self._write = write
        self._hashes: dict[str, list[str]] = {}

    def begin(self) -> None:
        """Create the `.tmp` folder, replacing a leftover one from a killed save of the same step."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self.tmp_path.exists():
            shutil.rmtree(self.tmp_path)
        self._guard(lambda: self.tmp_path.mkdir())

    def join(self) -> None:
        """Use a `.tmp` folder another rank created (after a barrier)."""
        if not self.tmp_path.is_dir():
            raise RentwiseError(f"checkpoint folder '{self.tmp_path}' is missing on this rank")

    def add(self, name: str, payload: bytes) -> None:
        """Write one file of the checkpoint durably."""
        if "/" in name or name in (MANIFEST_NAME, "") or name.startswith("."):
            raise ValueError(f"bad checkpoint file name {name!r}")
        self._hashes[name] = self._guard(lambda: self._write(self.tmp_path / name, payload)) or []
        if self._pause_s:
            time.sleep(self._pause_s)

    def commit(self, keep: int | None = None) -> Path:
        """Write the manifest, rename `.tmp` to final, move `latest`; keep the newest `keep` valid ones."""
        files, chunk_bytes = {}, HASH_CHUNK_BYTES  # the size `self._write` hashed with
        for path in sorted(self.tmp_path.iterdir()):
            # files other ranks wrote are hashed here
            chunks = self._hashes.get(path.name) or file_chunk_sha256(path, chunk_bytes)
            files[path.name] = {
                "size_bytes": path.stat().st_size,
                "chunk_bytes": chunk_bytes,
                "sha256_chunks": chunks,
            }
        manifest = {
            "format": MANIFEST_FORMAT,
            "step": self.step,
            "rentwise_version": __version__,
            "created_unix": time.time(),
            "files": files,
        }
        payload = json.dumps(manifest, indent=1, sort_keys=True).encode()
        self._guard(lambda: self._write(self.tmp_path / MANIFEST_NAME, payload))
        fsync_dir(self.tmp_path)
        replaced = self.final_path.with_name(self.final_path.name + ".replaced")
        if self.final_path.exists():  # a run resumed (`--resume PATH`) from before this step redoes it
            shutil.rmtree(replaced, ignore_errors=True)
            os.rename(self.final_path, replaced)
        os.rename(self.tmp_path, self.final_path)
        fsync_dir(self.root)
        shutil.rmtree(replaced, ignore_errors=True)
        write_latest(self.root, self.final_path.name)
        if keep is not None:
            prune(self.root, keep)
        return self.final_path

    def abort(self) -> None:
        """Remove the `.tmp` folder after a failed save; earlier checkpoints are untouched."""
        shutil.rmtree(self.tmp_path, ignore_errors=True)

    def _guard(self, action: Callable[[], _T]) -> _T:
        try:
            return action()
        except OSError as error:
            self.abort()
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                previous = newest_valid(self.root)
                kept = f"; {previous.path.name} is intact" if previous else ""
                raise RentwiseError(
                    f"disk full while writing checkpoint {self.final_path.name} in '{self.root}'{kept}",
                    hint="free space on that disk or lower `checkpoint.keep`, then rerun to resume",
                ) from error
            raise RentwiseError(
                f"could not write checkpoint {self.final_path.name} in '{self.root}': {error.strerror}"
            ) from error


def write_latest(root: Path, name: str) -> None:
    """Point `root/latest` at checkpoint `name` atomically (write, fsync, replace, fsync folder)."""
    tmp = root / (LATEST_NAME + ".tmp")
    tmp.unlink(missing_ok=True)
    _write_and_fsync(tmp, (name + "\n").encode())
    os.replace(tmp, root / LATEST_NAME)
    fsync_dir(root)


def read_latest(root: Path) -> str | None:
    """Return the checkpoint name `latest` points at, or None."""
    try:
        return (root / LATEST_NAME).read_text().strip() or None
    except OSError:
        return None


def inspect_checkpoint(path: Path, *, check_hashes: bool = True) -> CheckpointInfo:
    """Classify one checkpoint folder as valid, partial (unfinished save) or corrupt (fails its manifest)."""
    match = _NAME.match(path.name)
    step = int(match.group(1)) if match else -1
    size = sum(p.stat().st_size for p in path.iterdir() if p.is_file()) if path.is_dir() else 0

    def info(state: CheckpointState, problem: str | None = None) -> CheckpointInfo:
        return CheckpointInfo(path, step, state, size, problem)

    if path.name.endswith(".tmp"):
        return info("partial", "save did not finish (.tmp folder)")
    if path.name.endswith(".corrupt"):
        return info("corrupt", "set aside by an earlier resume")
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.is_file():
        return info("partial", "no manifest.json")
    try:
        manifest = json.loads(manifest_path.read_text())
        files: dict[str, dict[str, object]] = manifest["files"]
        version = manifest.get("format", 1)
        names = list(files)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return info("corrupt", "manifest.json is unreadable")
    if version not in READABLE_FORMATS:
        return info("corrupt", f"manifest format {version!r} is not one rentwise {__version__} reads")
    for name in names:
        entry = files[name]
        if not isinstance(entry, dict):
            return info("corrupt", "manifest.json is unreadable")
        file_path = path / name
        if not file_path.is_file():
            return info("corrupt", f"{name} is missing")
        if file_path.stat().st_size != entry.get("size_bytes"):
            return info(
                "corrupt",
                f"{name} has {file_path.stat().st_size} bytes, manifest says {entry.get('size_bytes')}",
            )
        if check_hashes and not _matches(file_path, entry):
            return info("corrupt", f"{name} does not match its sha256")
    return info("valid")


def _matches(path: Path, entry: dict[str, object]) -> bool:
    """Whether a file (of the size its manifest entry says) matches the entry's sha256 (chunks or whole)."""
    if "sha256_chunks" not in entry:  # format 1
        return sha256_file(path) == entry.get("sha256")
    chunk_bytes, expected = entry.get("chunk_bytes"), entry["sha256_chunks"]
    if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes <= 0:
        return False
    chunks = max(1, -(-path.stat().st_size // chunk_bytes))
    if not isinstance(expected, list) or len(expected) != chunks:  # (before hashing anything)
        return False
    return file_chunk_sha256(path, chunk_bytes) == expected


def iter_checkpoint_dirs(root: Path) -> Iterator[Path]:
    """Yield checkpoint folders (`step-*`, including `.tmp` and `.corrupt` ones) in `root`."""
    if not root.is_dir():
        return
    for path in root.iterdir():
        if path.is_dir() and _NAME.match(path.name):
            yield path


def list_checkpoints(root: Path, *, check_hashes: bool = True) -> list[CheckpointInfo]:
    """Every checkpoint folder under `root`, oldest step first, with its state."""
    infos = [inspect_checkpoint(p, check_hashes=check_hashes) for p in iter_checkpoint_dirs(root)]
    return sorted(infos, key=lambda i: (i.step, i.path.name))


def newest_valid(root: Path) -> CheckpointInfo | None:
    """The newest checkpoint whose manifest verifies, or None."""
    for info in reversed(list_checkpoints(root)):
        if info.state == "valid":
            return info
    return None


def find_resume_checkpoint(root: Path) -> tuple[CheckpointInfo | None, list[CheckpointInfo]]:
    """Return the newest valid checkpoint and the partial or corrupt ones newer than it (skipped)."""
    skipped: list[CheckpointInfo] = []
    for info in reversed(list_checkpoints(root)):
        if info.state == "valid":
            return info, skipped
        if not info.path.name.endswith(".corrupt"):
            skipped.append(info)
    return None, skipped


def set_aside_skipped(skipped: list[CheckpointInfo]) -> None:
    """Remove partial `.tmp` folders; rename corrupt ones to `.corrupt`, freeing the name."""
    for info in skipped:
        if info.path.name.endswith(".tmp"):
            shutil.rmtree(info.path, ignore_errors=True)
        else:
            _set_aside(info.path)


def _set_aside(path: Path) -> None:
    target = path.with_name(path.name + ".corrupt")
    if target.exists():
        shutil.rmtree(target)
    os.rename(path, target)


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` valid checkpoints (sizes checked, not hashes); return what went."""
    valid = [i for i in list_checkpoints(root, check_hashes=False) if i.state == "valid"]
    removed = []
    for info in valid[: max(0, len(valid) - keep)]:
        shutil.rmtree(info.path)
        removed.append(info.path)
    return removed
