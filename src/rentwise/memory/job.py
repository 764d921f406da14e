"""`MemoryJob`: every knob of a training or inference setup that changes peak GPU memory.

One frozen dataclass, validated on construction: a bad combination raises one `ConfigError` listing every
problem (STYLE.md §5). The CLI, the planner and the tracer all build this same type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from rentwise.errors import ConfigError

Method = Literal["full", "lora", "qlora", "inference"]
Precision = Literal["fp32", "amp_bf16", "amp_fp16", "bf16", "fp16"]
Optimizer = Literal["adamw", "adamw_fused", "adamw_8bit", "adafactor", "sgd", "sgd_momentum"]
Attention = Literal["eager", "sdpa", "flash"]
Sharding = Literal["ddp", "zero1", "zero2", "zero3", "fsdp"]
Offload = Literal["none", "optimizer", "optimizer+params"]

METHODS: tuple[str, ...] = get_args(Method)
PRECISIONS: tuple[str, ...] = get_args(Precision)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
ATTENTIONS: tuple[str, ...] = get_args(Attention)
SHARDINGS: tuple[str, ...] = get_args(Sharding)
OFFLOADS: tuple[str, ...] = get_args(Offload)

# peft's 'all-linear' targets every nn.Linear in the decoder layers except the output head.
ALL_LINEAR = "all-linear"
DEFAULT_LORA_TARGETS: tuple[str, ...] = ("q_proj", "v_proj")  # peft's default for Llama-family models


@dataclass(frozen=True)
class MemoryJob:
    """A training or inference setup, per step and per device. Defaults are a common LoRA recipe."""

    method: Method = "full"
    precision: Precision = "amp_bf16"
    """fp32; amp_bf16/amp_fp16 = autocast with fp32 master weights; bf16/fp16 = weights stored in half."""
    optimizer: Optimizer = "adamw"
    """adamw = torch's default foreach implementation (with its temporaries); adamw_fused has none."""
    micro_batch: int = 1
    seq_len: int = 2048
    grad_checkpointing: bool = False
    attention: Attention = "sdpa"
    """eager materialises heads x seq^2 scores; sdpa/flash keep only the output and logsumexp."""
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    """HF module names (q_proj, ..., down_proj) or ('all-linear',)."""
    lora_dropout: float = 0.0
    """peft's default 0.0 uses nn.Identity; > 0 keeps a dropout copy and mask per adapted linear."""
    qlora_double_quant: bool = True
    num_gpus: int = 1
    sharding: Sharding = "ddp"
    offload: Offload = "none"
    tensor_parallel: int = 1
    legacy_logits: bool = False
    """Transformers before ~4.45 upcast all logits to fp32 inside the model (kept by the returned output) and
    made a contiguous shifted copy for the loss; newer versions upcast inside the loss function."""
    context_len: int = 0
    """Inference: prompt tokens per sequence (defaults to seq_len)."""
    generate_len: int = 0
    """Inference: new tokens generated per sequence (KV cache grows to context_len + generate_len)."""

    def __post_init__(self) -> None:
        problems = job_problems(self)
        if problems:
            raise ConfigError("; ".join(problems), hint="run `rentwise memory --help` for the valid options")

    @property
    def is_training(self) -> bool:
        return self.method != "inference"

    @property
    def uses_adapter(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def prompt_len(self) -> int:
        return self.context_len or self.seq_len

    @property
    def data_parallel(self) -> int:
        """GPUs holding a data-parallel replica (or shard group): num_gpus / tensor_parallel."""
        return max(1, self.num_gpus // self.tensor_parallel)


def _choice(problems: list[str], field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        problems.append(f"{field} '{value}' is not one of {', '.join(allowed)}")


def job_problems(job: MemoryJob) -> list[str]:
    """Every problem with `job`, as readable sentences (empty when valid)."""
    problems: list[str] = []
    _choice(problems, "method", job.method, METHODS)
    _choice(problems, "precision", job.precision, PRECISIONS)
    _choice(problems, "optimizer", job.optimizer, OPTIMIZERS)
    _choice(problems, "attention", job.attention, ATTENTIONS)
    _choice(problems, "sharding", job.sharding, SHARDINGS)
    _choice(problems, "offload", job.offload, OFFLOADS)
    for name in ("micro_batch", "seq_len", "num_gpus", "tensor_parallel", "lora_rank"):
        value = getattr(job, name)
        if not isinstance(value, int) or value <= 0:
            problems.append(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
    if not 0.0 <= job.lora_dropout < 1.0:
        problems.append(f"lora-dropout must be in [0, 1), got {job.lora_dropout!r}")
    for name in ("context_len", "generate_len"):
        if getattr(job, name) < 0:
            problems.append(f"{name.replace('_', '-')} must not be negative, got {getattr(job, name)!r}")
    if problems:
        return problems
    if job.method == "qlora" and job.precision in ("fp32",):
        problems.append("QLoRA computes in bf16 or fp16; precision fp32 makes no sense with a 4-bit base")
    if job.num_gpus % job.tensor_parallel:
        problems.append(f"num-gpus {job.num_gpus} is not a multiple of tensor-parallel {job.tensor_parallel}")
    if job.offload != "none" and job.sharding not in ("zero2", "zero3", "fsdp"):
        problems.append(
            f"offload '{job.offload}' needs sharding zero2, zero3 or fsdp (DeepSpeed ZeRO-Offload or FSDP "
            f"CPU offload), not '{job.sharding}'"
        )
    elif job.offload == "optimizer+params" and job.sharding not in ("zero3", "fsdp"):
        problems.append("offloading parameters needs sharding zero3 or fsdp")
    if job.method == "inference" and job.grad_checkpointing:
        problems.append("gradient checkpointing only applies to training, not inference")
    if job.attention == "flash" and job.precision in ("fp32",):
        problems.append("flash attention runs in bf16/fp16 only, not fp32")
    return problems
