"""Counts from `ModelShape` equal what transformers builds and what peft adapts, for every bundled config.

Full-size models are built under `torch.device("meta")` (no memory, no weights). InternLM2 and Baichuan2 are
remote-code architectures (no hub here), so they are built as the transformers-native llama with the same
sizes: their fused `wqkv`/`W_pack` projections hold exactly q, k and v, so the count is the same; their
module names are checked by test_shape.py, not against their remote code.
"""

from __future__ import annotations

from typing import Any

import pytest

from rentwise.models.catalog import list_models, load_shape
from rentwise.models.shape import ModelShape, shape_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

REMOTE_CODE_AS_LLAMA = ("internlm2", "baichuan")
BUNDLED = [entry.name for entry in list_models()]


def raw_config(name: str) -> dict[str, Any]:
    return {key: value for key, value in load_shape(name).extra.items() if key != "_rentwise"}


def build(config: dict[str, Any], meta: bool) -> Any:
    """`AutoModelForCausalLM.from_config` of a config.json dict (remote-code types as their llama twin)."""
    config = dict(config)
    model_type = config.pop("model_type")
    if model_type in REMOTE_CODE_AS_LLAMA:
        config["attention_bias"] = bool(config.pop("bias", False))
        for key in ("auto_map", "architectures", "rope_scaling"):
            config.pop(key, None)
        model_type = "llama"
    hf_config = transformers.AutoConfig.for_model(model_type, **config)
    if meta:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(hf_config)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(hf_config)


def shrink(config: dict[str, Any]) -> dict[str, Any]:
    """The same architecture and flags at toy sizes (a CPU build takes milliseconds)."""
    small = {key: value for key, value in config.items() if not key.endswith("_token_id")}
    heads_equal = (
        config.get("num_key_value_heads", config["num_attention_heads"]) == config["num_attention_heads"]
    )
    small.update(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=128
    )
    small.update(num_key_value_heads=4 if heads_equal else 2, pad_token_id=0)
    if "head_dim" in config:
        small["head_dim"] = 16
    for key, value in (("num_local_experts", 4), ("num_experts", 4), ("num_experts_per_tok", 2),
                       ("moe_intermediate_size", 32), ("shared_expert_intermediate_size", 48)):  # fmt: skip
        if key in config:
            small[key] = value
    return small


# Architectures SUPPORTED_TYPES knows that no bundled model uses, with their optional biases switched on.
EXTRA_TINY = {
    "gemma": {"model_type": "gemma", "head_dim": 16},
    "llama-biased": {"model_type": "llama", "attention_bias": True, "mlp_bias": True},
    "qwen3-biased": {"model_type": "qwen3", "attention_bias": True, "head_dim": 16},
    "qwen2-moe": {"model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48},
}  # fmt: skip
TINY = {name: shrink(raw_config(name)) for name in BUNDLED} | {
    name: shrink({"num_attention_heads": 4, "num_key_value_heads": 2, **config})
    for name, config in EXTRA_TINY.items()
}


def numel(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", BUNDLED)
def test_num_params_equals_transformers_numel(name: str) -> None:
    assert load_shape(name).num_params == numel(build(raw_config(name), meta=True))


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_variant_counts_equal_transformers(name: str) -> None:
    assert shape_from_config(TINY[name]).num_params == numel(build(TINY[name], meta=False))


def layer_weights(model: Any) -> dict[str, tuple[int, ...]]:
    """Layer 0 weights by short name: nn.Linear as (in, out, has_bias), 3-D experts as (in, out, experts)."""
    layer = model.model.layers[0]
    found: dict[str, tuple[int, ...]] = {}
    for module_name, module in layer.named_modules():
        short = module_name.removeprefix("self_attn.").removeprefix("mlp.")
        if isinstance(module, torch.nn.Linear):
            found[short] = (module.in_features, module.out_features, int(module.bias is not None))
    for param_name, param in layer.named_parameters():
        short = param_name.removeprefix("mlp.")
        if param.dim() == 3:  # (experts, out, in)
            found[short] = (param.shape[2], param.shape[1], param.shape[0])
        elif short == "gate.weight":  # router: (experts, hidden)
            found["gate"] = (param.shape[1], param.shape[0], 0)
    return found


def expected_weights(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    expected: dict[str, tuple[int, ...]] = {}
    for lin in shape.layer_linears():
        third = lin.copies if lin.copies > 1 else int(lin.has_bias)
        expected[lin.name] = (lin.in_features, lin.out_features, third)
    return expected


NATIVE_TINY = sorted(
    name for name, config in TINY.items() if config["model_type"] not in REMOTE_CODE_AS_LLAMA
)


@pytest.mark.parametrize("name", NATIVE_TINY)
def test_layer_linears_match_the_modules_of_layer_zero(name: str) -> None:
    model = build(TINY[name], meta=True)
    assert layer_weights(model) == expected_weights(shape_from_config(TINY[name]))


# peft 0.21.2 warns that its doubled-rank pattern for fused MoE `gate_up_proj` "did not match any targeted
# module", yet applies it (the counts below, and the adapter shapes, show rank 2r there).
@pytest.mark.filterwarnings("ignore:The following rank_pattern keys did not match:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:The following alpha_pattern keys did not match:RuntimeWarning")
@pytest.mark.parametrize("name", NATIVE_TINY)
def test_lora_params_equal_peft_all_linear(name: str) -> None:
    model = build(TINY[name], meta=False)
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear"))
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert shape_from_config(TINY[name]).lora_params(4) == trainable


# Published active-parameter figures, given to 0.1B: Mistral AI's Mixtral announcement ("12.9B parameters
# per token") and the Qwen3-30B-A3B model card ("3.3B activated"; we count 3.353B, so Qwen truncates).
@pytest.mark.parametrize(("name", "active_billions"), [("mixtral-8x7b", 12.9), ("qwen3-30b-a3b", 3.3)])
def test_moe_active_params_match_published_figures(name: str, active_billions: float) -> None:
    assert load_shape(name).num_active_params / 1e9 == pytest.approx(active_billions, abs=0.06)
