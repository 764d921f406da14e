"""The training loop: one loop on accelerate for full, LoRA and QLoRA, that checkpoints and resumes exactly.

Read `train()` top to bottom: check inputs (before any GPU time), find a checkpoint to resume from, build
the model, restore state, then loop over optimizer steps. The safe point is the end of an optimizer step
(after the last micro-batch of the accumulation cycle): the state there is fully described by weights,
optimizer, scheduler, scaler, RNG and the step number, so a checkpoint never holds half-accumulated gradients.
What a checkpoint holds is in `state.py`, how it is written atomically in `checkpoints.py`. Distribution
(DDP) is accelerate's; this file adds one small all-reduce per step so every rank agrees on stopping, saving
and OOM retries. FSDP and DeepSpeed are refused until checkpoints handle sharded parameters.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import math
import os
import time
import warnings as py_warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from rentwise.errors import ConfigError, PreemptedError, RentwiseError
from rentwise.training import checkpoints as ckpt
from rentwise.training.config import TrainConfig, resolve_model_source
from rentwise.training.data import (
    Example,
    Sampler,
    build_examples,
    collate,
    load_tokenizer,
    read_rows,
    split_eval,
)
from rentwise.training.metrics import CostMeter, MetricsLog, ProgressView
from rentwise.training.model import (
    BASE_DIR_NAME,
    check_qlora_supported,
    ensure_random_base,
    export_final,
    load_model_config,
    prepare_model,
)
from rentwise.training.preemption import SavePolicy, StopFlag
from rentwise.training.state import RunProgress, add_run_state, choose_resume, restore_run_state

FINAL_DIR_NAME = "final"
METRICS_NAME = "metrics.jsonl"


class FaultInjector(Protocol):
    """Test seam: called before every micro-batch's forward pass; may raise (e.g. a fake CUDA OOM)."""

    def before_micro_step(self, step: int, micro: int, micro_batch: int) -> None: ...


@dataclass(frozen=True)
class RunOptions:
    """How to run, as opposed to what to train (which is `TrainConfig`)."""

    resume: str = "auto"
    """`auto` (newest valid checkpoint, or fresh), `never` (fresh; fails if checkpoints exist), or a path."""
    show_progress: bool = True
    pause_in_save_s: float = 0.0
    """Test seam (RENTWISE_TEST_PAUSE_IN_SAVE): sleep after each checkpoint file so kills land mid-save."""
    step_delay_s: float = 0.0
    """Test seam (RENTWISE_TEST_STEP_DELAY): sleep after each optimizer step."""
    write_file: ckpt.FileWriter = ckpt.write_synced
    """Seam: how checkpoint files are written (tests inject a full disk)."""


@dataclass(frozen=True)
class RunResult:
    rank: int
    steps: int
    resumed_from: int | None
    final_dir: Path
    last_checkpoint: Path | None
    train_loss: float | None
    elapsed_s: float
    cost: float | None
    warnings: tuple[str, ...] = ()


def train(
    config: TrainConfig,
    options: RunOptions = RunOptions(),
    *,
    faults: FaultInjector | None = None,
    stop: StopFlag | None = None,
    warn: Any = None,
) -> RunResult:
    """Train to `max_steps` (or `epochs`), checkpointing by policy and on signals; resume when asked.

    Raises `PreemptedError` (exit 75) after saving a checkpoint on SIGTERM/SIGINT/SIGUSR1.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # ours is the one progress bar

    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        if warn is not None and accelerator.is_main_process:
            warn(message)

    # 1. Everything that can be wrong with the inputs fails here, before a model is built or a GPU touched.
    if config.precision == "fp16" and not torch.cuda.is_available():
        raise ConfigError("precision fp16 needs a CUDA GPU (a grad scaler on CPU is not supported)",
                          hint="use precision: bf16 or fp32 on CPU")  # fmt: skip
    check_qlora_supported(config)
    mixed = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[config.precision]
    accelerator = Accelerator(mixed_precision=mixed)
    rank, world = accelerator.process_index, accelerator.num_processes
    if accelerator.distributed_type.value in ("FSDP", "DEEPSPEED"):
        raise ConfigError(
            f"{accelerator.distributed_type.value} is not supported by rentwise checkpoints yet (they save "
            "full trainable tensors from rank 0, which sharded parameters are not)",
            hint="launch with plain DDP (accelerate launch --multi_gpu), or use method lora/qlora to fit",
        )
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != world:
        raise ConfigError(
            f"launched as {launched} processes but accelerate runs {world}",
            hint="on CPU set ACCELERATE_USE_CPU=true so accelerate uses gloo (see docs/train.md)",
        )
    hf_config = load_model_config(config)
    model_path, _ = resolve_model_source(config.model)
    tokenizer = load_tokenizer(config.tokenizer, model_path)
    if tokenizer.vocab_size > hf_config.vocab_size:
        raise ConfigError(
            f"tokenizer has {tokenizer.vocab_size} tokens but model '{config.model.source}' has a vocabulary "
            f"of {hf_config.vocab_size}",
            hint="use the model's own tokenizer, or set model.overrides.vocab_size for a random-init shape",
        )
    examples = build_examples(read_rows(config.data.path), config.data, tokenizer, config.data.path)
    eval_examples: list[Example] = []
    if config.data.eval_path is not None:
        eval_rows = read_rows(config.data.eval_path)
        eval_examples = build_examples(eval_rows, config.data, tokenizer, config.data.eval_path)
    else:
        examples, eval_examples = split_eval(examples, config.data.eval_fraction, config.seed)
    micro_batch, accum = config.micro_batch, config.accumulation_steps(world)
    sampler = Sampler(len(examples), micro_batch * accum * world, world, config.seed)
    if sampler.steps_per_epoch == 0:
        raise ConfigError(
            f"data has {len(examples)} examples, fewer than one global batch of {sampler.global_batch}",
            hint="lower micro_batch / grad_accum / global_batch, or add data",
        )
    total_steps = config.max_steps or sampler.steps_per_epoch * (config.epochs or 1)

    # The lock, signal handlers, determinism flag and log are undone on any exit, error or not.
    with contextlib.ExitStack() as cleanup:
        cleanup.enter_context(py_warnings.catch_warnings())
        # peft calls a transformers property that transformers 5 marks deprecated: noise, not the user's doing
        py_warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
        # A signal from here on stops the run at the end of its next step (during a long model load too).
        flag = stop or StopFlag()
        if stop is None:
            flag.install()
            cleanup.callback(flag.restore)
        # 2. Where to start: the newest checkpoint whose manifest verifies (rank 0 decides, everyone follows).
        out = config.output_dir
        if accelerator.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
            cleanup.enter_context(_locked_output_dir(out))
        resume_dir = choose_resume(out, options.resume, note) if accelerator.is_main_process else None
        resume_dir = _broadcast(resume_dir, world)

        # 3. Seed, build the model (a random frozen base is written once), optimizer and schedule.
        if not torch.cuda.is_available():  # bit-exact resume is promised on CPU; on CUDA it would cost speed
            cleanup.callback(torch.use_deterministic_algorithms, torch.are_deterministic_algorithms_enabled())
            torch.use_deterministic_algorithms(True)
        set_seed(config.seed)
        if config.method.kind != "full" and resolve_model_source(config.model)[1]:
            if accelerator.is_main_process:
                ensure_random_base(hf_config, out / BASE_DIR_NAME, is_main=True)
            accelerator.wait_for_everyone()
            set_seed(config.seed)  # adapters start the same whether or not this run had to write the base
        model = prepare_model(config, hf_config, out, is_main=accelerator.is_main_process)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(config, total_steps))
        # the scheduler is not prepared: accelerate would step it once per process; we step it once per step
        model, optimizer = accelerator.prepare(model, optimizer)
        state = RunProgress(micro_batch=micro_batch, grad_accum=accum, world_size=world)
        if resume_dir is not None:
            state = restore_run_state(resume_dir, accelerator, model, optimizer, scheduler, config, note)
            micro_batch, accum = state.micro_batch, state.grad_accum  # keeps an OOM-guard reduction
        resumed_from = state.step if resume_dir is not None else None

        # 4. The loop.
        log = MetricsLog(out / METRICS_NAME if accelerator.is_main_process else None)
        cleanup.callback(log.close)
        if resumed_from is not None:
            log.write({"event": "resume", "step": resumed_from, "from": str(resume_dir)})
        policy = SavePolicy(
            config.checkpoint.every_steps,
            config.checkpoint.every_minutes * 60 if config.checkpoint.every_minutes else None,
            config.checkpoint.auto_mtbi_minutes * 60 if config.checkpoint.auto_mtbi_minutes else None,
        )
        meter = CostMeter(config.price_per_hour, config.currency)
        run = _Run(accelerator, model, optimizer, scheduler, config, options, policy, log, tokenizer.pad_id)
        last_checkpoint: Path | None = resume_dir
        started = time.monotonic() - state.elapsed_s
        order_epoch, order, last_eval_step = -1, list[int](), -1
        show = options.show_progress and accelerator.is_main_process
        with ProgressView(total_steps, state.step, enabled=show) as view:
            while state.step < total_steps:
                epoch = state.step // sampler.steps_per_epoch
                if epoch != order_epoch:
                    order_epoch, order = epoch, sampler.epoch_order(epoch)
                step_examples = [examples[i] for i in sampler.step_indices(state.step, rank, order)]
                step_started = time.monotonic()
                try:
                    loss, tokens = run.micro_steps(step_examples, micro_batch, accum, state.step, faults)
                    oom = 0.0
                except torch.OutOfMemoryError:
                    if state.step >= config.oom_guard_steps + (resumed_from or 0):
                        raise
                    loss, tokens, oom = 0.0, 0.0, 1.0
                due_time = float(accelerator.is_main_process and policy.due_by_time())
                stopping, due_time, oom, loss, tokens = run.agree(
                    [float(flag.is_set), due_time, oom, loss, tokens]
                )
                if oom:
                    micro_batch, accum = _shrink_micro_batch(micro_batch, accum, optimizer)
                    log.write(
                        {"event": "oom", "step": state.step, "micro_batch": micro_batch, "grad_accum": accum}
                    )
                    note(
                        f"out of memory at step {state.step}: retrying with micro_batch {micro_batch}, "
                        f"grad_accum {accum} (global batch unchanged)"
                    )
                    continue
                grad_norm = run.optimizer_step(params)
                state.step += 1
                state.tokens_seen += int(tokens)
                state.last_loss = loss / world
                state.micro_batch, state.grad_accum = micro_batch, accum
                state.elapsed_s = time.monotonic() - started
                tokens_per_s = tokens / max(time.monotonic() - step_started, 1e-9)
                log.write(
                    {
                        "step": state.step,
                        "loss": state.last_loss,
                        "lr": scheduler.get_last_lr()[0],
                        "grad_norm": grad_norm,
                        "tokens_per_s": tokens_per_s,
                        "elapsed_s": state.elapsed_s,
                        "peak_gpu_mem_bytes": _peak_gpu_bytes(),
                        "cost": meter.cost(state.elapsed_s),
                    }
                )
                view.update(state.step, state.last_loss, tokens_per_s)
                if options.step_delay_s:
                    time.sleep(options.step_delay_s)
                if eval_examples and config.eval_every_steps and state.step % config.eval_every_steps == 0:
                    run.evaluate(eval_examples, micro_batch, state.step)
                    last_eval_step = state.step
                if stopping or due_time or policy.due_by_steps(state.step) or state.step == total_steps:
                    last_checkpoint = run.save(state)
                if stopping:
                    waited = flag.seconds_since_signal() or 0.0
                    log.write(
                        {
                            "event": "preempted",
                            "step": state.step,
                            "signal": flag.signal_name,
                            "signal_to_exit_s": waited,
                        }
                    )
                    raise PreemptedError(
                        f"stopped by {flag.signal_name or 'a signal on another rank'} at step {state.step}; "
                        f"checkpoint {last_checkpoint.name if last_checkpoint else '?'} saved "
                        f"{waited:.2f} s after the signal",
                        hint="rerun the same command to resume",
                    )
        if eval_examples and last_eval_step != state.step:
            run.evaluate(eval_examples, micro_batch, state.step)
        final_dir = out / FINAL_DIR_NAME
        if accelerator.is_main_process:
            tokenizer_folder = _tokenizer_folder(config, model_path)
            export_final(accelerator.unwrap_model(model), config, final_dir, tokenizer_folder)
        accelerator.wait_for_everyone()
    return RunResult(
        rank=rank,
        steps=state.step, resumed_from=resumed_from, final_dir=final_dir, last_checkpoint=last_checkpoint,
        train_loss=state.last_loss, elapsed_s=state.elapsed_s, cost=meter.cost(state.elapsed_s),
        warnings=tuple(warnings),
    )  # fmt: skip


@dataclass
class _Run:
    """The objects one training run threads through every step (so helpers take one argument, not nine)."""

    accelerator: Any
    model: Any
    optimizer: Any
    scheduler: Any
    config: TrainConfig
    options: RunOptions
    policy: SavePolicy
    log: MetricsLog
    pad_id: int

    def micro_steps(
        self,
        step_examples: list[Example],
        micro_batch: int,
        accum: int,
        step: int,
        faults: FaultInjector | None,
    ) -> tuple[float, float]:
        """Forward and backward over one accumulation cycle; ranks sync gradients on the last micro-batch."""
        loss_sum, tokens = 0.0, 0
        for micro in range(accum):
            batch = self._batch(step_examples[micro * micro_batch : (micro + 1) * micro_batch])
            if faults is not None:
                faults.before_micro_step(step, micro, micro_batch)
            sync = contextlib.nullcontext() if micro == accum - 1 else self.accelerator.no_sync(self.model)
            with sync:
                loss = self.model(**batch).loss / accum
                self.accelerator.backward(loss)
            loss_sum += float(loss.detach())
            tokens += int(batch["attention_mask"].sum())
        return loss_sum, float(tokens)

    def optimizer_step(self, params: list[torch.nn.Parameter]) -> float | None:
        """Clip, step the optimizer and the schedule, clear gradients; return the gradient norm."""
        grad_norm = None
        if self.config.max_grad_norm is not None:
            grad_norm = float(self.accelerator.clip_grad_norm_(params, self.config.max_grad_norm))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def agree(self, values: list[float]) -> list[float]:
        """Sum small per-rank values over all ranks in one all-reduce (flags become 'any rank said yes')."""
        if self.accelerator.num_processes == 1:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        torch.distributed.all_reduce(tensor)
        return [float(v) for v in tensor.tolist()]

    @torch.no_grad()
    def evaluate(self, examples: list[Example], micro_batch: int, step: int) -> float:
        """Log the mean loss over the eval examples (rank r takes every world-th); no RNG is drawn."""
        self.model.eval()
        mine = examples[self.accelerator.process_index :: self.accelerator.num_processes]
        total, count = 0.0, 0.0
        for start in range(0, len(mine), micro_batch):
            batch = self._batch(mine[start : start + micro_batch])
            total += float(self.model(**batch).loss) * len(batch["input_ids"])
            count += len(batch["input_ids"])
        self.model.train()
        total, count = self.agree([total, count])
        eval_loss = total / max(count, 1.0)
        self.log.write({"event": "eval", "step": step, "eval_loss": eval_loss})
        return eval_loss

    def save(self, state: RunProgress) -> Path:
        """Write one checkpoint: every rank adds its RNG state; rank 0 writes the rest and commits."""
        started = time.monotonic()
        accelerator, is_main = self.accelerator, self.accelerator.is_main_process
        writer = ckpt.CheckpointWriter(
            self.config.output_dir,
            state.step,
            pause_s=self.options.pause_in_save_s,
            write=self.options.write_file,
        )
        if is_main:
            writer.begin()
        accelerator.wait_for_everyone()
        if not is_main:
            writer.join()
        add_run_state(writer, accelerator, self.model, self.optimizer, self.scheduler, self.config, state)
        accelerator.wait_for_everyone()
        if is_main:
            writer.commit(keep=self.config.checkpoint.keep)
            size = sum(p.stat().st_size for p in writer.final_path.iterdir())
            seconds = time.monotonic() - started
            mb_per_s = size / 1e6 / max(seconds, 1e-9)
            self.log.write(
                {
                    "event": "checkpoint",
                    "step": state.step,
                    "save_s": seconds,
                    "bytes": size,
                    "mb_per_s": mb_per_s,
                }
            )
        accelerator.wait_for_everyone()
        self.policy.record_save(time.monotonic() - started)
        return writer.final_path

    def _batch(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.accelerator.device) for k, v in collate(examples, self.pad_id).items()}


def _broadcast(value: Path | None, world: int) -> Path | None:
    if world == 1:
        return value
    box: list[Any] = [str(value) if value else None]
    torch.distributed.broadcast_object_list(box, src=0)
    return Path(box[0]) if box[0] else None


def _shrink_micro_batch(micro_batch: int, accum: int, optimizer: Any) -> tuple[int, int]:
    """Halve the micro-batch (a divisor of the per-rank batch), raise accumulation to match, free memory."""
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    per_rank = micro_batch * accum
    if micro_batch == 1:
        raise RentwiseError(
            "out of memory at micro_batch 1",
            hint="enable gradient_checkpointing, use method lora/qlora, or a GPU with more memory "
            "(`rentwise fix` ranks the options)",
        )
    smaller = max(d for d in range(1, micro_batch // 2 + 1) if per_rank % d == 0)
    return smaller, per_rank // smaller


def _lr_lambda(config: TrainConfig, total_steps: int) -> Any:
    """Linear warmup, then constant, linear decay to 0, or cosine decay to 0 (Loshchilov & Hutter 2017)."""
    warmup, schedule = config.warmup_steps, config.schedule

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        if schedule == "linear":
            return max(0.0, 1.0 - progress)
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return factor


@contextlib.contextmanager
def _locked_output_dir(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on the output folder (the OS releases it even on SIGKILL)."""
    with open(out / ".lock", "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"another `rentwise train` is writing to '{out}'",
                hint="wait for it to finish or choose another output_dir",
            ) from None
        yield


def _peak_gpu_bytes() -> int | None:
    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None


def _tokenizer_folder(config: TrainConfig, model_path: Path) -> Path | None:
    if config.tokenizer == "bytes":
        return None
    folder = Path(config.tokenizer) if config.tokenizer else model_path
    return folder if folder.is_dir() else None
