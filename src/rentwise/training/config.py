"""The run config of `rentwise train`: YAML validated by pydantic, every problem reported at once, by field.

Defaults live here and nowhere else. Relative paths in a YAML file are resolved against the file's folder, so
a config can be run from any working directory. The resolved config is stored in every checkpoint; on resume
the fields in `EXACTNESS_FIELDS` are compared and a change is reported: it breaks bit-exact continuation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rentwise.errors import ConfigError, NotFoundError, did_you_mean

Method = Literal["full", "lora", "qlora"]
Precision = Literal["fp32", "bf16", "fp16"]
DataFormat = Literal["text", "instruction", "chat"]
Schedule = Literal["constant", "linear", "cosine"]

BUNDLED_CONFIGS = Path(__file__).resolve().parent.parent / "models" / "configs"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Section):
    source: str
    """A local Hugging Face model folder, a `config.json` path, or a bundled shape name."""
    random_init: bool | None = None
    """Random weights from the config instead of loading; default: True unless `source` holds weights."""
    overrides: dict[str, int | float | str | bool] = Field(default_factory=dict)
    """config.json fields to replace (e.g. `num_hidden_layers: 2` for a smoke test of a bundled shape)."""


class DataConfig(_Section):
    path: Path
    """jsonl, json, csv, parquet, txt, or a folder saved with `datasets.save_to_disk`."""
    format: DataFormat = "text"
    text_field: str = "text"
    instruction_field: str = "instruction"
    input_field: str = "input"
    """Optional extra context appended to the instruction when a row has it."""
    response_field: str = "response"
    messages_field: str = "messages"
    max_length: int = Field(default=512, ge=8)
    """Tokens per example; longer examples are truncated."""
    packing: bool = False
    """Concatenate examples and cut into `max_length` blocks (no padding)."""
    eval_path: Path | None = None
    eval_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Hold out this fraction of `path` for evaluation when `eval_path` is not given."""


class MethodConfig(_Section):
    kind: Method = "full"
    lora_r: int = Field(default=8, ge=1)
    lora_alpha: float = Field(default=16.0, gt=0)
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class CheckpointPolicy(_Section):
    every_steps: int | None = Field(default=None, ge=1)
    every_minutes: float | None = Field(default=None, gt=0)
    auto_mtbi_minutes: float | None = Field(default=None, gt=0)
    """Policy `auto`: the mean time between interruptions; the interval comes from Daly's formula."""
    keep: int = Field(default=3, ge=1)
    """How many valid checkpoints to keep (newest first)."""


class TrainConfig(_Section):
    model: ModelConfig
    tokenizer: str | None = None
    """`bytes` (built-in byte-level tokenizer) or a local tokenizer folder; default: the model folder."""
    data: DataConfig
    method: MethodConfig = MethodConfig()
    precision: Precision = "fp32"
    micro_batch: int = Field(default=4, ge=1)
    grad_accum: int | None = Field(default=None, ge=1)
    global_batch: int | None = Field(default=None, ge=1)
    """Examples per optimizer step over all processes; sets `grad_accum` from micro_batch × processes."""
    lr: float = Field(default=2e-4, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    schedule: Schedule = "cosine"
    warmup_steps: int = Field(default=0, ge=0)
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    epochs: int | None = Field(default=None, ge=1)
    max_steps: int | None = Field(default=None, ge=1)
    gradient_checkpointing: bool = False
    seed: int = 0
    output_dir: Path = Path("runs/rentwise")
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    eval_every_steps: int | None = Field(default=None, ge=1)
    price_per_hour: float | None = Field(default=None, ge=0)
    currency: str = "USD"
    oom_guard_steps: int = Field(default=3, ge=0)
    """Optimizer steps during which a CUDA out-of-memory halves the micro-batch and retries."""

    @model_validator(mode="after")
    def _check_combinations(self) -> TrainConfig:
        problems = []
        if self.grad_accum is not None and self.global_batch is not None:
            problems.append("give grad_accum or global_batch, not both")
        if self.epochs is None and self.max_steps is None:
            problems.append("give epochs or max_steps")
        if self.data.eval_path is not None and self.data.eval_fraction > 0:
            problems.append("give data.eval_path or data.eval_fraction, not both")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-batches per optimizer step on each process."""
        if self.global_batch is None:
            return self.grad_accum or 1
        per_step = self.micro_batch * world_size
        if self.global_batch % per_step:
            raise ConfigError(
                f"global_batch {self.global_batch} is not a multiple of micro_batch × processes = {per_step}",
                hint="change global_batch or micro_batch",
            )
        return self.global_batch // per_step


# Fields whose change makes a resumed run differ from an uninterrupted one (anything else is free to change).
EXACTNESS_FIELDS = (
    "model", "tokenizer", "data", "method", "precision", "micro_batch", "grad_accum", "global_batch", "lr",
    "weight_decay", "schedule", "warmup_steps", "max_grad_norm", "gradient_checkpointing", "seed",
)  # fmt: skip


def load_config(path: Path, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Read a YAML run config, apply `key.path=value` overrides, validate, and check that inputs exist."""
    if not path.is_file():
        raise NotFoundError(f"config file '{path}' does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"config '{path}' is not valid YAML: {error}".replace("\n", " ")) from error
    if not isinstance(raw, dict):
        raise ConfigError(f"config '{path}' must be a mapping of fields, not {type(raw).__name__}")
    for override in overrides:
        apply_override(raw, override)
    return build_config(raw, base_dir=path.parent, source=str(path))


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Set `a.b.c=value` in a nested dict; the value is parsed as YAML (`3`, `true`, `[q_proj]`)."""
    key, sep, value = override.partition("=")
    if not sep or not key:
        raise ConfigError(f"override '{override}' is not KEY=VALUE", hint="e.g. --set max_steps=100")
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{override}': '{part}' is not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(value)


def build_config(raw: dict[str, Any], *, base_dir: Path, source: str = "config") -> TrainConfig:
    """Validate a config mapping; raise one `ConfigError` listing every problem with its field path."""
    raw = _resolve_paths(raw, base_dir)
    problems = _missing_inputs(raw)
    try:
        config = TrainConfig.model_validate(raw)
    except ValidationError as error:
        problems = _validation_problems(error) + problems
    if problems:
        count = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
        raise ConfigError(
            f"config '{source}' has {count}: " + "; ".join(problems),
            hint="docs/train.md lists every field; relative paths are read from the config file's folder",
        )
    return config


def _validation_problems(error: ValidationError) -> list[str]:
    problems = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        message = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        problems.append(f"{where}: {message}")
    return problems


def _resolve_paths(raw: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """Make relative paths absolute against the config's folder (a copy; values of a wrong type are left)."""

    def resolve(value: Any) -> Any:
        return str((base_dir / value).resolve()) if isinstance(value, str) and value else value

    def resolve_if_exists(value: Any) -> Any:  # names may also be bundled shapes or `bytes`
        return resolve(value) if isinstance(value, str) and (base_dir / value).exists() else value

    raw = dict(raw)
    if isinstance(raw.get("data"), dict):
        raw["data"] = {
            **raw["data"],
            **{k: resolve(raw["data"][k]) for k in ("path", "eval_path") if k in raw["data"]},
        }
    if isinstance(raw.get("model"), dict) and "source" in raw["model"]:
        raw["model"] = {**raw["model"], "source": resolve_if_exists(raw["model"]["source"])}
    if "tokenizer" in raw:
        raw["tokenizer"] = resolve_if_exists(raw["tokenizer"])
    if "output_dir" in raw:
        raw["output_dir"] = resolve(raw["output_dir"])
    else:
        raw["output_dir"] = resolve(str(TrainConfig.model_fields["output_dir"].default))
    return raw


def _missing_inputs(raw: dict[str, Any]) -> list[str]:
    """Input files and names that do not exist (checked on the raw mapping, so they join pydantic's list)."""
    problems = []
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    for key in ("path", "eval_path"):
        value = data.get(key) if data else None
        if isinstance(value, str) and not Path(value).exists():
            problems.append(f"data.{key}: file '{value}' does not exist")
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    name = model.get("source") if model else None
    if isinstance(name, str) and not Path(name).exists() and not (BUNDLED_CONFIGS / f"{name}.json").is_file():
        known = sorted(p.stem for p in BUNDLED_CONFIGS.glob("*.json"))
        problems.append(
            f"model.source: '{name}' is neither a path nor a bundled shape{did_you_mean(name, known)}"
        )
    tokenizer = raw.get("tokenizer")
    if isinstance(tokenizer, str) and tokenizer != "bytes" and not Path(tokenizer).is_dir():
        problems.append(f"tokenizer: '{tokenizer}' is neither 'bytes' nor a tokenizer folder")
    return problems


def resolve_model_source(config: ModelConfig) -> tuple[Path, bool]:
    """Return (folder or config.json path, random_init) for the model source."""
    path = Path(config.source)
    if not path.exists():
        path = BUNDLED_CONFIGS / f"{config.source}.json"
    has_weights = path.is_dir() and any((path / name).exists() for name in WEIGHT_FILES)
    random_init = (not has_weights) if config.random_init is None else config.random_init
    if not random_init and not has_weights:
        raise ConfigError(
            f"model.source '{config.source}' has no weights ({' / '.join(WEIGHT_FILES)})",
            hint="set model.random_init: true to train from a random initialisation",
        )
    return path, random_init


def exactness_changes(saved: dict[str, Any], current: TrainConfig) -> list[str]:
    """Dotted fields among EXACTNESS_FIELDS that differ between a checkpoint's config and this run's."""
    now = current.model_dump(mode="json")
    changes: list[str] = []
    for field in EXACTNESS_FIELDS:
        _diff(field, saved.get(field), now.get(field), changes)
    return changes


def _diff(path: str, before: Any, after: Any, out: list[str]) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            _diff(f"{path}.{key}", before.get(key), after.get(key), out)
    elif before != after:
        out.append(f"{path}: {before!r} -> {after!r}")
