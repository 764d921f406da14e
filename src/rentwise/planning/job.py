"""`JobSpec`: the fine-tune to plan: model, method, data, batch, constraints and the planning assumptions.

Validated on construction: one `ConfigError` lists every problem (STYLE.md §5). Fields left `None` in the
strategy block (micro-batch, checkpointing, sharding, offload) are searched by the planner; set ones are
kept as given.

Counting a dataset's tokens uses the model's tokenizer when `transformers` (the `trace` extra) is installed
and the tokenizer is in the local Hugging Face cache; otherwise it divides characters by 4, OpenAI's rule of
thumb for English text ("one token ≈ 4 characters", OpenAI tokenizer help page). CJK text runs nearer one
token per 1–1.5 characters, so the approximation undercounts it: pass --tokens when you know better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from rentwise.errors import ConfigError, NotFoundError
from rentwise.memory.job import ATTENTIONS, OFFLOADS, OPTIMIZERS, PRECISIONS, SHARDINGS
from rentwise.planning.offers import BILLINGS

CHARS_PER_TOKEN = 4.0
TRAINING_METHODS = ("full", "lora", "qlora")

# ASSUMPTIONS for the setup and checkpoint terms, each overridable on the command line. They are not
# measurements of any provider: a 1 Gbit/s download link (model weights from a hub mirror), a 100 Mbit/s
# upload link (your dataset from home or office), and 1 GB/s sustained checkpoint writes (one NVMe SSD).
DEFAULT_DOWNLOAD_GBPS = 0.125
DEFAULT_UPLOAD_GBPS = 0.0125
DEFAULT_DISK_WRITE_GBPS = 1.0


@dataclass(frozen=True)
class JobSpec:
    """A fine-tuning job to plan. Sizes in bytes, times in hours, money in the display currency."""

    model: str
    method: str = "lora"
    allow_method_change: bool = False
    """Let the planner switch full → LoRA → QLoRA to fit a card (changes what you train)."""
    precision: str | None = None
    """None = the usual recipe per method: amp_bf16 (fp32 master weights) for full fine-tuning, bf16 base
    weights for LoRA (fp32 adapters, peft's default) and QLoRA."""
    optimizer: str = "adamw"
    attention: str = "sdpa"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    seq_len: int = 2048
    tokens: int = 0
    """Training tokens in one epoch."""
    epochs: float = 1.0
    global_batch: int = 32
    """Sequences per optimizer step (micro-batch × accumulation × data-parallel GPUs)."""
    micro_batch: int | None = None
    grad_checkpointing: bool | None = None
    sharding: str | None = None
    offload: str | None = None
    deadline_h: float | None = None
    budget: float | None = None
    billings: tuple[str, ...] = ("on_demand", "spot")
    max_gpus: int | None = None
    upload_bytes: int = 0
    """Dataset bytes to upload to the machine (0 = already there)."""
    checkpoints_keep: int = 2
    checkpoint_every_h: float = 1.0
    """On-demand and reserved runs: compute hours between checkpoints (spot uses Daly's optimum)."""
    eval_fraction: float = 0.0
    """Evaluation time as a share of training time (0 = no evaluation planned)."""
    snapshot_months: float = 0.0
    """Months the final checkpoint is kept as a snapshot (0 = none)."""
    spot_mtbi_h: float | None = None
    """Mean time between spot interruptions for every offer (None = per offer, else the default)."""
    restart_s: float | None = None
    utilisation: float | None = None
    """Share of dense peak reached, taken as given for every method (overrides the per-GPU default and the
    QLoRA factor; see planning/time.py)."""
    utilisation_by_gpu: tuple[tuple[str, float], ...] = ()
    """Per-GPU utilisation (catalog name, share of peak) of a full or LoRA run, e.g. learned from the ledger;
    the planner multiplies it by the method factor (QLoRA × 0.74, planning/time.py). `utilisation` wins."""
    memory_extras: tuple[tuple[str, object], ...] = ()
    """Other `MemoryJob` fields passed through unchanged, e.g. (("qlora_double_quant", False),)."""
    download_gbps: float = DEFAULT_DOWNLOAD_GBPS
    upload_gbps: float = DEFAULT_UPLOAD_GBPS
    disk_write_gbps: float = DEFAULT_DISK_WRITE_GBPS

    def __post_init__(self) -> None:
        problems = spec_problems(self)
        if problems:
            raise ConfigError("; ".join(problems), hint="run `rentwise plan --help` for the valid options")

    def precision_for(self, method: str) -> str:
        """The precision to run `method` in: the user's, else the usual recipe for that method."""
        # The same recipe as DEFAULT_PRECISION in cli/job_options.py (`memory`/`fix`); change both together.
        return self.precision or ("amp_bf16" if method == "full" else "bf16")

    @property
    def total_tokens(self) -> float:
        return self.tokens * self.epochs

    def methods_to_try(self) -> tuple[str, ...]:
        """The job's method, then the lighter ones when changing the method is allowed."""
        if not self.allow_method_change:
            return (self.method,)
        return TRAINING_METHODS[TRAINING_METHODS.index(self.method) :]


def spec_problems(spec: JobSpec) -> list[str]:
    """Every problem with `spec`, as readable sentences (empty when valid)."""
    problems: list[str] = []
    choices = (("method", spec.method, TRAINING_METHODS),
               ("precision", spec.precision_for(spec.method), PRECISIONS),
               ("optimizer", spec.optimizer, OPTIMIZERS),
               ("attention", spec.attention, ATTENTIONS))  # fmt: skip
    for field, value, allowed in choices:
        if value not in allowed:
            problems.append(f"{field} '{value}' is not one of {', '.join(allowed)}")
    if spec.sharding is not None and spec.sharding not in SHARDINGS:
        problems.append(f"sharding '{spec.sharding}' is not one of {', '.join(SHARDINGS)}")
    if spec.offload is not None and spec.offload not in OFFLOADS:
        problems.append(f"offload '{spec.offload}' is not one of {', '.join(OFFLOADS)}")
    for billing in spec.billings:
        if billing not in BILLINGS:
            problems.append(f"billing '{billing}' is not one of {', '.join(BILLINGS)}")
    if not spec.billings:
        problems.append("allow at least one billing mode")
    if spec.tokens <= 0:
        problems.append("the job has no data: give --tokens, --samples with --avg-tokens, or --dataset")
    for name in ("seq_len", "global_batch", "lora_rank"):
        if getattr(spec, name) <= 0:
            problems.append(f"{name.replace('_', '-')} must be a positive integer, got {getattr(spec, name)}")
    if spec.micro_batch is not None and spec.micro_batch <= 0:
        problems.append(f"micro-batch must be a positive integer, got {spec.micro_batch}")
    positive: tuple[tuple[str, float | None], ...] = (
        ("epochs", spec.epochs), ("deadline", spec.deadline_h), ("budget", spec.budget),
        ("max-gpus", spec.max_gpus), ("checkpoint-every", spec.checkpoint_every_h),
        ("spot-mtbi", spec.spot_mtbi_h), ("mfu", spec.utilisation),
        ("download bandwidth", spec.download_gbps),
        ("upload bandwidth", spec.upload_gbps), ("disk write bandwidth", spec.disk_write_gbps),
    )  # fmt: skip
    for label, number in positive:
        if number is not None and not (number > 0 and math.isfinite(number)):
            problems.append(f"{label} must be a positive number, got {number}")
    for gpu_name, share in spec.utilisation_by_gpu:
        if not 0 < share <= 1:
            problems.append(f"utilisation for {gpu_name} must be in (0, 1], got {share}")
    if spec.utilisation is not None and spec.utilisation > 1:
        problems.append(f"mfu is a share of peak between 0 and 1, got {spec.utilisation}")
    nonneg: tuple[tuple[str, float | None], ...] = (
        ("upload size", spec.upload_bytes), ("eval fraction", spec.eval_fraction),
        ("snapshot months", spec.snapshot_months), ("checkpoints to keep", spec.checkpoints_keep),
        ("restart time", spec.restart_s),
    )  # fmt: skip
    for label, number in nonneg:
        if number is not None and not (number >= 0 and math.isfinite(number)):
            problems.append(f"{label} must be a finite number, 0 or more, got {number}")
    return problems


def tokens_from_samples(samples: int, avg_tokens: float) -> int:
    """Tokens in `samples` examples of `avg_tokens` each."""
    if samples <= 0 or avg_tokens <= 0:
        raise ConfigError(
            f"samples ({samples}) and average tokens per sample ({avg_tokens}) must be positive",
            hint="e.g. --samples 20000 --avg-tokens 512",
        )
    return int(samples * avg_tokens)


@dataclass(frozen=True)
class TokenCount:
    """Tokens in a dataset file and how they were counted."""

    tokens: int
    method: str
    """'tokenizer <name>' or 'chars/4 approximation'."""


def count_dataset_tokens(path: Path, tokenizer_id: str | None = None) -> TokenCount:
    """Count tokens of a text/JSON/JSONL file with the tokenizer if available locally, else chars / 4."""
    if not path.is_file():
        raise NotFoundError(f"dataset file '{path}' does not exist", hint="pass a text, JSON or JSONL file")
    text = path.read_text(encoding="utf-8", errors="replace")
    if tokenizer_id:
        counted = _count_with_tokenizer(text, tokenizer_id)
        if counted is not None:
            return TokenCount(counted, f"tokenizer {tokenizer_id}")
    return TokenCount(math.ceil(len(text) / CHARS_PER_TOKEN), "chars/4 approximation")


def _count_with_tokenizer(text: str, tokenizer_id: str) -> int | None:
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_id, local_files_only=True)
    except Exception:  # no local copy, gated repo, or remote code: fall back to the stated approximation
        return None
    return sum(len(tokenizer(line)["input_ids"]) for line in text.splitlines() if line.strip())
