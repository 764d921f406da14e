"""The memory knobs as click options, shared by `memory`, `plan` and `fix` so the flags never drift apart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from rentwise.memory.job import (
    ATTENTIONS,
    METHODS,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    SHARDINGS,
    MemoryJob,
)

F = TypeVar("F", bound=Callable[..., Any])

# Precision when --precision is not given: full fine-tuning keeps fp32 master weights under bf16 autocast
# (HF Trainer --bf16); adapters train on a bf16 base (the common peft recipe); inference loads bf16.
# The same recipe as JobSpec.precision_for in planning/job.py (`plan`); change both together.
DEFAULT_PRECISION = {"full": "amp_bf16", "lora": "bf16", "qlora": "bf16", "inference": "bf16"}

_OPTIONS: list[Callable[[F], F]] = [
    click.option("--method", "-m", type=click.Choice(METHODS), default="lora", show_default=True,
                 help="Full fine-tune, LoRA, QLoRA (4-bit NF4 base) or inference."),
    click.option("--precision", "-p", type=click.Choice(PRECISIONS), default=None,
                 help="fp32; amp_bf16/amp_fp16 = autocast over fp32 weights; bf16/fp16 = half weights. "
                      "[default: amp_bf16 for full, bf16 otherwise]"),
    click.option("--optimizer", "-o", type=click.Choice(OPTIMIZERS), default="adamw", show_default=True,
                 help="adamw = torch's default foreach AdamW (with its step temporaries)."),
    click.option("--batch", "-b", "micro_batch", type=int, default=1, show_default=True,
                 help="Micro-batch (sequences per GPU per step)."),
    click.option("--seq", "-s", "seq_len", type=int, default=2048, show_default=True,
                 help="Sequence length in tokens (inference: prompt length)."),
    click.option("--grad-ckpt/--no-grad-ckpt", "grad_checkpointing", default=False, show_default=True,
                 help="Gradient (activation) checkpointing."),
    click.option("--attention", type=click.Choice(ATTENTIONS), default="sdpa", show_default=True,
                 help="eager keeps heads x seq^2 scores; sdpa/flash do not."),
    click.option("--lora-rank", "-r", type=int, default=16, show_default=True),
    click.option("--lora-targets", default="q_proj,v_proj", show_default=True,
                 help="Comma-separated module names, or all-linear."),
    click.option("--lora-dropout", type=float, default=0.0, show_default=True),
    click.option("--double-quant/--no-double-quant", "qlora_double_quant", default=True, show_default=True,
                 help="QLoRA double quantisation of the absmax constants."),
    click.option("--gpus", "num_gpus", type=int, default=1, show_default=True, help="GPUs in the job."),
    click.option("--sharding", type=click.Choice(SHARDINGS), default="ddp", show_default=True,
                 help="ddp replicates; zero1/2/3 (DeepSpeed) and fsdp shard."),
    click.option("--offload", type=click.Choice(OFFLOADS), default="none", show_default=True,
                 help="CPU offload (with zero2/zero3/fsdp)."),
    click.option("--tp", "tensor_parallel", type=int, default=1, show_default=True,
                 help="Tensor-parallel degree (a plain divisor)."),
    click.option("--legacy-logits", is_flag=True, default=False,
                 help="transformers < 4.45: fp32 logits kept in the model output plus a shifted copy."),
    click.option("--context", "context_len", type=int, default=0,
                 help="Inference: prompt tokens [default: --seq]."),
    click.option("--generate", "generate_len", type=int, default=0, show_default=True,
                 help="Inference: tokens to generate (KV cache grows to context + generate)."),
]  # fmt: skip

JOB_OPTION_NAMES = (
    "method", "precision", "optimizer", "micro_batch", "seq_len", "grad_checkpointing", "attention",
    "lora_rank", "lora_targets", "lora_dropout", "qlora_double_quant", "num_gpus", "sharding", "offload",
    "tensor_parallel", "legacy_logits", "context_len", "generate_len",
)  # fmt: skip


def job_options(func: F) -> F:
    """Decorate a click command with every memory knob (see `job_from_options`)."""
    for option in reversed(_OPTIONS):
        func = option(func)
    return func


def job_from_options(options: dict[str, Any]) -> MemoryJob:
    """Build the `MemoryJob` from parsed options; pops the job keys from `options`."""
    values = {name: options.pop(name) for name in JOB_OPTION_NAMES}
    values["precision"] = values["precision"] or DEFAULT_PRECISION[values["method"]]
    values["lora_targets"] = tuple(t.strip() for t in str(values["lora_targets"]).split(",") if t.strip())
    return MemoryJob(**values)
