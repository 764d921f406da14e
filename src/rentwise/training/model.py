"""One model-preparation step for full fine-tuning, LoRA and QLoRA (configurations, not three code paths).

  full   every parameter trains; the checkpoint holds all of them.
  lora   the base is frozen; peft adds low-rank adapters; the checkpoint holds only the adapters.
  qlora  lora on a 4-bit NF4 base (bitsandbytes; CUDA only), as in Dettmers et al. 2023.
A randomly initialised base (a bundled or config.json shape) that is frozen is written once to
`output_dir/base/` and loaded from there on every resume: frozen weights are never saved again.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from rentwise.errors import ConfigError, MissingExtraError
from rentwise.training.config import TrainConfig, resolve_model_source

BASE_DIR_NAME = "base"


def load_model_config(config: TrainConfig) -> Any:
    """The transformers config of the model source with `model.overrides` applied (no weights read)."""
    from transformers import AutoConfig

    path, _ = resolve_model_source(config.model)
    file = path / "config.json" if path.is_dir() else path
    try:
        raw = {k: v for k, v in json.loads(file.read_text()).items() if not k.startswith("_")}
    except (OSError, ValueError) as error:
        raise ConfigError(f"could not read a model config from '{file}': {error}") from error
    model_type = raw.pop("model_type", None)
    if model_type is None:
        raise ConfigError(f"model config '{file}' has no 'model_type' field")
    unknown = sorted(set(config.model.overrides) - set(raw) - set(_config_fields(model_type)))
    if unknown:
        raise ConfigError(
            f"model.overrides: {', '.join(map(repr, unknown))} not a field of a {model_type} config"
        )
    raw.update(config.model.overrides)
    if "num_hidden_layers" in config.model.overrides:
        raw.pop("layer_types", None)  # derived per layer; rebuilt from the new layer count
    if "vocab_size" in config.model.overrides:  # a shrunk vocabulary drops special ids that fall outside it
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if isinstance(raw.get(key), int) and raw[key] >= raw["vocab_size"]:
                raw[key] = None
    try:
        return AutoConfig.for_model(model_type, **raw)
    except (ValueError, TypeError, KeyError) as error:
        raise ConfigError(f"model config '{file}' (with model.overrides) is not valid: {error}") from error


def _config_fields(model_type: str) -> list[str]:
    from transformers import AutoConfig

    try:
        return list(AutoConfig.for_model(model_type).to_dict())
    except (ValueError, KeyError):
        return []


def check_qlora_supported(config: TrainConfig) -> None:
    """QLoRA needs CUDA and bitsandbytes: fail before anything is loaded when either is missing."""
    if config.method.kind != "qlora":
        return
    if not torch.cuda.is_available():
        raise ConfigError(
            "method qlora needs a CUDA GPU (bitsandbytes 4-bit kernels); this machine has none",
            hint="use method.kind: lora on CPU, or run on a CUDA machine",
        )
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        raise MissingExtraError(
            "method qlora needs the bitsandbytes package", hint="pip install bitsandbytes"
        )


def prepare_model(config: TrainConfig, hf_config: Any, output_dir: Path, *, is_main: bool) -> Any:
    """Build the model for `config.method` with fp32 master weights; returns a module ready for accelerate.

    Callers seed torch first: a random initialisation is then the same on every rank and every run.
    """
    from transformers import AutoModelForCausalLM

    path, random_init = resolve_model_source(config.model)
    kind = config.method.kind
    if random_init and kind == "full":
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    else:
        if random_init:
            path = ensure_random_base(hf_config, output_dir / BASE_DIR_NAME, is_main=is_main)
        kwargs: dict[str, Any] = {"dtype": torch.float32, "local_files_only": True}
        if kind == "qlora":
            kwargs.update(_qlora_kwargs(config))
        elif not random_init:
            kwargs["config"] = hf_config
        model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if kind == "full":
        return model
    return _add_adapters(model, config)


def _qlora_kwargs(config: TrainConfig) -> dict[str, Any]:
    from transformers import BitsAndBytesConfig

    compute = torch.bfloat16 if config.precision == "bf16" else torch.float16
    quant = BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
    )
    return {"quantization_config": quant, "device_map": {"": torch.cuda.current_device()}}


def _add_adapters(model: Any, config: TrainConfig) -> Any:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if config.method.kind == "qlora":
        model = prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
            model, use_gradient_checkpointing=config.gradient_checkpointing
        )
    elif config.gradient_checkpointing:
        model.enable_input_require_grads()  # checkpointed blocks need an input that requires grad
    lora = LoraConfig(
        r=config.method.lora_r,
        lora_alpha=config.method.lora_alpha,  # type: ignore[arg-type]  # peft accepts floats
        lora_dropout=config.method.lora_dropout,
        target_modules=config.method.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def ensure_random_base(hf_config: Any, folder: Path, *, is_main: bool) -> Path:
    """Write a random-initialised base to `folder` once (tmp folder, then rename); later runs reuse it."""
    from transformers import AutoModelForCausalLM

    if (folder / "config.json").is_file() or not is_main:
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.save_pretrained(str(tmp))
    for file in tmp.iterdir():
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())
    os.rename(tmp, folder)
    return folder


def trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """The parameters that train (all for full, the adapters for LoRA), as contiguous CPU tensors."""
    return {
        name: param.detach().to("cpu").contiguous()
        for name, param in model.named_parameters()
        if param.requires_grad
    }


def load_trainable_state(model: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Copy saved trainable tensors into the model; every trainable parameter must be present."""
    params = dict(model.named_parameters())
    expected = {name for name, param in params.items() if param.requires_grad}
    missing, unexpected = expected - set(tensors), set(tensors) - expected
    if missing or unexpected:
        raise ConfigError(
            f"checkpoint does not match the model: {len(missing)} trainable tensors missing, "
            f"{len(unexpected)} unexpected (e.g. {sorted(missing or unexpected)[0]})",
            hint="resume with the method and model the checkpoint was written with, or --resume never",
        )
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor)


def export_final(model: Any, config: TrainConfig, folder: Path, tokenizer_folder: Path | None) -> Path:
    """Write a folder that plain `from_pretrained` loads (tmp folder, then rename)."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if config.method.kind != "full":
        path, random_init = resolve_model_source(config.model)
        base = config.output_dir / BASE_DIR_NAME if random_init else path
        model.peft_config["default"].base_model_name_or_path = str(base)
    model.save_pretrained(str(tmp))
    if tokenizer_folder is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(tokenizer_folder), local_files_only=True).save_pretrained(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)
    return folder
