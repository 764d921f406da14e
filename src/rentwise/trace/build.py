"""Build the real Hugging Face model of a `ModelShape` on the meta device, apply the method, materialise it.

The model class is exactly what `AutoModelForCausalLM.from_config` builds (no weights are read). LoRA comes
from peft, QLoRA's 4-bit base layers from `qlora.py`, gradient checkpointing from transformers itself.
`materialise` swaps every meta parameter and buffer for a new tensor created under the tracker (a `FakeTensor`
inside `FakeTensorMode`, a real one in the exactness tests), tagged weights / adapter / quant constants.
"""

from __future__ import annotations

import types
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rentwise.errors import ConfigError
from rentwise.memory.job import ALL_LINEAR, MemoryJob
from rentwise.models.shape import ModelShape
from rentwise.trace.qlora import NF4Weight, replace_linears_with_nf4
from rentwise.trace.tracker import MemoryTracker

# Model types transformers does not ship (remote code) are built as a Llama of the same sizes: fusing
# projections (InternLM2's wqkv, Baichuan's W_pack) changes module names, not tensor sizes.
_LLAMA_STAND_INS = ("internlm2", "baichuan", "yi", "deepseek")


@dataclass
class BuiltModel:
    """The model to trace and the facts the tracer needs about it."""

    model: nn.Module
    backbone: str
    """Qualified name of the decoder stack; tensors made outside it (lm_head, loss) count as logits."""
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None

    def is_logits_module(self, name: str) -> bool:
        return not (name == self.backbone or name.startswith(self.backbone + "."))


def dtypes(job: MemoryJob) -> tuple[torch.dtype, torch.dtype | None]:
    """(dtype parameters are stored in, autocast dtype or None) for the job's precision."""
    half = torch.float16 if job.precision in ("fp16", "amp_fp16") else torch.bfloat16
    if job.precision == "fp32":
        return torch.float32, None
    if job.precision.startswith("amp_"):
        return torch.float32, half
    return half, None


def _hf_config_dict(shape: ModelShape) -> dict[str, Any]:
    config = {k: v for k, v in dict(shape.extra).items() if not k.startswith("_")}
    if config and shape.model_type not in _LLAMA_STAND_INS:
        return config
    # No raw config (hand-built shape) or a remote-code type: an equivalent Llama of the same sizes.
    return {
        "model_type": "llama",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "tie_word_embeddings": shape.tie_embeddings,
        "attention_bias": shape.qkv_bias,
        "mlp_bias": shape.mlp_bias,
        "max_position_embeddings": shape.max_position_embeddings,
    }


def hf_config(shape: ModelShape, attention: str) -> Any:
    """The transformers config object for `shape`, with the attention implementation set."""
    from transformers import AutoConfig

    raw = _hf_config_dict(shape)
    model_type = raw.pop("model_type")
    try:
        config = AutoConfig.for_model(model_type, **raw)
    except (ValueError, KeyError) as error:
        raise ConfigError(
            f"transformers cannot build a '{model_type}' model for {shape.name!r}: {error}",
            hint="upgrade transformers, or trace a model type it ships",
        ) from None
    config._attn_implementation = attention
    config.use_cache = False
    return config


def build_model(shape: ModelShape, job: MemoryJob) -> BuiltModel:
    """Build the job's model on the meta device: HF model + method (LoRA/QLoRA) + gradient checkpointing."""
    from transformers import AutoModelForCausalLM

    param_dtype, autocast_dtype = dtypes(job)
    attention = "eager" if job.attention == "eager" else "sdpa"
    config = hf_config(shape, attention)
    base_dtype = param_dtype
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=base_dtype)  # type: ignore[no-untyped-call]
    _balance_moe_routing(model)
    if job.method == "qlora":
        compute = autocast_dtype or param_dtype
        replace_linears_with_nf4(model, job.lora_targets, compute, job.qlora_double_quant)
    if job.is_training and job.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if job.method == "full":
        model.train()
    elif job.uses_adapter:
        model = _apply_lora(model, job)
        model.train()
    else:
        model.eval()
        model.requires_grad_(False)
    return BuiltModel(model, _backbone_name(model), param_dtype, autocast_dtype)


def _apply_lora(model: nn.Module, job: MemoryJob) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    targets: str | list[str] = "all-linear" if ALL_LINEAR in job.lora_targets else list(job.lora_targets)
    # lora_alpha = 2r is a common recipe; it only scales values, not memory.
    lora = LoraConfig(
        r=job.lora_rank, lora_alpha=2 * job.lora_rank, lora_dropout=job.lora_dropout, target_modules=targets
    )
    try:
        with warnings.catch_warnings():
            # peft 0.21 maps all-linear on Mixtral/Qwen3-MoE onto the 3-D expert tensors and then warns that
            # its own rank/alpha pattern for `gate_up_proj` matched no module; the warning is peft's noise.
            warnings.filterwarnings("ignore", "The following (rank|alpha)_pattern keys", RuntimeWarning)
            return get_peft_model(model, lora)
    except ValueError as error:
        raise ConfigError(
            f"LoRA targets {', '.join(job.lora_targets)} do not match this model: {error}",
            hint="pass --lora-targets all-linear, or module names the model has",
        ) from None


def _backbone_name(model: nn.Module) -> str:
    for name, module in model.named_modules():
        if type(module).__name__.endswith("Model") and hasattr(module, "layers"):
            return str(name)
    return ""


def _expert_linear(module: nn.Module, name: str, expert: int, x: torch.Tensor) -> torch.Tensor:
    """x @ W[expert].T with W a fused 3-D expert parameter."""
    weights: torch.Tensor = getattr(module, name)
    return nn.functional.linear(x, weights[expert])


def _balanced_experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' eager experts loop with routing assumed perfectly balanced (fake tensors have no values).

    Same ops, in the same order, as `MixtralExperts.forward`; expert e gets ceil/floor(tokens*k/E) tokens.
    """
    experts: int = self.num_experts  # type: ignore[assignment]
    final = torch.zeros_like(hidden_states)
    with torch.no_grad():
        expert_mask = torch.nn.functional.one_hot(top_k_index, num_classes=experts + 1).permute(2, 1, 0)
    tokens, k = top_k_index.shape
    routed = tokens * k
    for expert in range(experts):
        count = routed // experts + (1 if expert < routed % experts else 0)
        if count == 0:
            continue
        token_idx = torch.arange(count, device=hidden_states.device) % tokens
        top_k_pos = torch.zeros(count, dtype=torch.long, device=hidden_states.device)
        current = hidden_states[token_idx]
        gate, up = _expert_linear(self, "gate_up_proj", expert, current).chunk(2, dim=-1)
        current = self.act_fn(gate) * up  # type: ignore[operator]
        current = _expert_linear(self, "down_proj", expert, current)
        current = current * top_k_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, current.to(final.dtype))
    del expert_mask
    return final


def _balance_moe_routing(model: nn.Module) -> None:
    for module in model.modules():
        if (
            hasattr(module, "gate_up_proj")
            and hasattr(module, "down_proj")
            and hasattr(module, "num_experts")
        ):
            module.forward = types.MethodType(_balanced_experts_forward, module)


def _category(name: str, module: nn.Module) -> str:
    if "lora_" in name:
        return "adapter"
    if isinstance(module, NF4Weight) and not name.endswith(("weight", "bias")):
        return "quant_constants"
    return "weights"


def materialise(model: nn.Module, tracker: MemoryTracker, device: str = "cpu") -> None:
    """Replace meta parameters and buffers by tensors created under `tracker` (shared ones stay shared)."""
    replaced: dict[int, torch.Tensor] = {}
    originals: list[torch.Tensor] = []  # keeps ids in `replaced` unique until the loop ends
    for module_name, module in model.named_modules():
        for attr in ("_parameters", "_buffers"):
            table: dict[str, torch.Tensor | None] = getattr(module, attr)
            for local, tensor in list(table.items()):
                if tensor is None:
                    continue
                full = f"{module_name}.{local}" if module_name else local
                new = replaced.get(id(tensor))
                if new is None:
                    with tracker.categorise(_category(full, module), module_name):
                        data = _new_tensor(tensor, device)
                    new = (
                        nn.Parameter(data, requires_grad=tensor.requires_grad)
                        if attr == "_parameters"
                        else data
                    )
                    replaced[id(tensor)] = new
                    originals.append(tensor)
                table[local] = new


def _new_tensor(meta: torch.Tensor, device: str) -> torch.Tensor:
    data = torch.empty(meta.shape, dtype=meta.dtype, device=device)
    if data.is_floating_point():
        with torch.no_grad():
            data.normal_(0.0, 0.02)
    else:
        with torch.no_grad():
            data.zero_()
    return data
