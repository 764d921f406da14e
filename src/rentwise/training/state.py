"""What a checkpoint holds and how a run gets it back: the run state besides the loop's local variables.

Files of a checkpoint (written by `add_run_state`, read by `restore_run_state`):
  trainable.safetensors  the parameters that train (all of them for full, the adapters for LoRA/QLoRA)
  optimizer.pt, scheduler.pt, scaler.pt (fp16)   their `state_dict()`s (loaded with `weights_only=True`)
  rng-rank{r}.pt         python, numpy, torch CPU and CUDA generator states of process r
  progress.json          step, tokens seen, training time, micro-batch/accumulation in use, process count
  config.json            the resolved run config (compared on resume: see `config.EXACTNESS_FIELDS`)
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rentwise.errors import ConfigError, NotFoundError
from rentwise.training import checkpoints as ckpt
from rentwise.training.config import TrainConfig, exactness_changes
from rentwise.training.model import load_trainable_state, trainable_state


@dataclass
class RunProgress:
    """Where the run is, besides weights and optimizer (progress.json)."""

    step: int = 0
    tokens_seen: int = 0
    elapsed_s: float = 0.0
    micro_batch: int = 0
    grad_accum: int = 0
    world_size: int = 1
    last_loss: float | None = None


def add_run_state(
    writer: ckpt.CheckpointWriter, accelerator: Any, model: Any, optimizer: Any, scheduler: Any,
    config: TrainConfig, progress: RunProgress,
) -> None:  # fmt: skip
    """Add this process's files to a checkpoint: its RNG state; on rank 0 also everything else."""
    writer.add(f"rng-rank{accelerator.process_index}.pt", _to_bytes(_rng_state()))
    if not accelerator.is_main_process:
        return
    from safetensors.torch import save as save_safetensors

    writer.add("trainable.safetensors", save_safetensors(trainable_state(accelerator.unwrap_model(model))))
    writer.add("optimizer.pt", _to_bytes(optimizer.state_dict()))
    writer.add("scheduler.pt", _to_bytes(scheduler.state_dict()))
    if accelerator.scaler is not None:
        writer.add("scaler.pt", _to_bytes(accelerator.scaler.state_dict()))
    writer.add("progress.json", json.dumps(asdict(progress), indent=1).encode())
    writer.add("config.json", json.dumps(config.model_dump(mode="json"), indent=1).encode())


def restore_run_state(
    folder: Path, accelerator: Any, model: Any, optimizer: Any, scheduler: Any, config: TrainConfig, note: Any
) -> RunProgress:
    """Load everything a checkpoint holds back into the run; the RNG last, so nothing after it draws."""
    from safetensors.torch import load_file

    saved_config = json.loads((folder / "config.json").read_text())
    changes = exactness_changes(saved_config, config)
    if changes:
        note(
            f"config changed since {folder.name}; the resumed run will not match an uninterrupted one: "
            + "; ".join(changes)
        )
    progress = RunProgress(**json.loads((folder / "progress.json").read_text()))
    if progress.world_size != accelerator.num_processes:
        raise ConfigError(
            f"checkpoint {folder.name} was written by {progress.world_size} processes, this run has "
            f"{accelerator.num_processes}",
            hint="resume with the same number of processes, or start over with --resume never",
        )
    load_trainable_state(accelerator.unwrap_model(model), load_file(folder / "trainable.safetensors"))
    optimizer.load_state_dict(_from_bytes(folder / "optimizer.pt"))
    scheduler.load_state_dict(_from_bytes(folder / "scheduler.pt"))
    if accelerator.scaler is not None and (folder / "scaler.pt").exists():
        accelerator.scaler.load_state_dict(_from_bytes(folder / "scaler.pt"))
    rng_file = folder / f"rng-rank{accelerator.process_index}.pt"
    _set_rng_state(_from_bytes(rng_file))
    return progress


def choose_resume(out: Path, resume: str, note: Any) -> Path | None:
    """Pick the checkpoint to resume from per `--resume`; report and set aside partial or corrupt ones."""
    if resume == "never":
        existing = [i for i in ckpt.list_checkpoints(out, check_hashes=False) if i.state == "valid"]
        if existing:
            raise ConfigError(
                f"output folder '{out}' already has checkpoints (newest {existing[-1].path.name})",
                hint="use --resume auto to continue, or choose another output_dir",
            )
        return None
    if resume != "auto":
        if not Path(resume).is_dir():
            raise NotFoundError(
                f"checkpoint folder '{resume}' does not exist",
                hint=f"`rentwise checkpoints {out}` lists them; --resume auto picks the newest valid one",
            )
        chosen = ckpt.inspect_checkpoint(Path(resume))
        if chosen.state != "valid":
            raise ConfigError(f"checkpoint '{resume}' is {chosen.state}: {chosen.problem}")
        return chosen.path
    found, skipped = ckpt.find_resume_checkpoint(out)
    for info in skipped:
        note(f"skipping {info.state} checkpoint {info.path.name}: {info.problem}")
    ckpt.set_aside_skipped(skipped)
    return found.path if found else None


def _rng_state() -> dict[str, Any]:
    py_version, py_state, py_gauss = random.getstate()
    np_state: tuple[Any, ...] = np.random.get_state(legacy=True)  # type: ignore[assignment]
    return {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [
            np_state[0],
            torch.from_numpy(np_state[1].astype(np.int64)),
            np_state[2],
            np_state[3],
            np_state[4],
        ],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _set_rng_state(saved: dict[str, Any]) -> None:
    version, py_state, gauss = saved["python"]
    random.setstate((version, tuple(py_state), gauss))
    name, keys, *rest = saved["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(saved["torch"])
    if saved["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])


def _to_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _from_bytes(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)
