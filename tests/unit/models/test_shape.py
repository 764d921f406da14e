"""ModelShape parsing and counting rules, without torch: biases, fused names, MoE, LoRA sizes, bad configs."""

from __future__ import annotations

from typing import Any

import pytest

from rentwise.errors import ConfigError
from rentwise.models.catalog import load_shape
from rentwise.models.shape import shape_from_config


def tiny(model_type: str, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model_type": model_type,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "vocab_size": 128,
    }
    return {**config, **overrides}


@pytest.mark.parametrize(
    ("config", "qkv_bias", "o_bias"),
    [
        (tiny("llama"), False, False),
        (tiny("llama", attention_bias=True), True, True),
        (tiny("qwen2"), True, False),  # Qwen2 always biases q/k/v, never o
        (tiny("qwen2", attention_bias=False), True, False),
        (tiny("qwen3", attention_bias=True), True, True),
        (tiny("glm"), True, False),  # GlmConfig defaults attention_bias=True
        (tiny("mistral", attention_bias=True), False, False),  # Mistral's modeling code ignores the flag
        (tiny("phi3", attention_bias=True), False, False),
        (tiny("internlm2", bias=True), True, True),
        (tiny("qwen2_moe", num_experts=4, num_experts_per_tok=2, qkv_bias=False), False, False),
    ],
)
def test_biases_follow_each_architectures_rules(config: dict[str, Any], qkv_bias: bool, o_bias: bool) -> None:
    shape = shape_from_config(config)
    assert (shape.qkv_bias, shape.o_bias) == (qkv_bias, o_bias)


@pytest.mark.parametrize(
    ("model_type", "names"),
    [
        ("llama", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
        ("phi3", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
        ("glm", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"]),
        ("internlm2", ["wqkv", "wo", "w1", "w3", "w2"]),
        ("baichuan", ["W_pack", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    ],
)
def test_layer_linears_use_the_module_names_peft_matches(model_type: str, names: list[str]) -> None:
    assert [lin.name for lin in shape_from_config(tiny(model_type)).layer_linears()] == names


def test_fused_projections_have_the_summed_width() -> None:
    shape = shape_from_config(tiny("phi3"))
    qkv, _, gate_up, _ = shape.layer_linears()
    assert (qkv.in_features, qkv.out_features) == (64, 64 + 2 * 32)
    assert (gate_up.in_features, gate_up.out_features) == (64, 2 * 96)


def test_moe_layer_counts_every_expert_and_the_router() -> None:
    shape = shape_from_config(
        tiny("qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16)
    )
    attention = 2 * 64 * 64 + 2 * 64 * 32  # q, o: 64x64; k, v: 64x32
    experts = 8 * (64 * 64 + 32 * 64)  # gate_up 64->2*32, down 32->64, per expert
    router, norms, qk_norms = 64 * 8, 2 * 64, 2 * 16
    assert shape.layer_params() == attention + experts + router + norms + qk_norms
    active_experts = 2 * (64 * 64 + 32 * 64)
    assert shape.layer_params(active_only=True) == attention + active_experts + router + norms + qk_norms
    assert [lin.name for lin in shape.layer_linears() if not lin.is_nn_linear] == [
        "experts.gate_up_proj",
        "experts.down_proj",
        "gate",
    ]


def test_qwen2_moe_has_a_gated_shared_expert() -> None:
    shape = shape_from_config(
        tiny(
            "qwen2_moe",
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
        )
    )
    names = [lin.name for lin in shape.layer_linears()]
    assert names[-4:] == [
        "shared_expert.gate_proj",
        "shared_expert.up_proj",
        "shared_expert.down_proj",
        "shared_expert_gate",
    ]


def test_gemma2_has_four_norms_per_layer_and_ties_embeddings_by_default() -> None:
    shape = shape_from_config(tiny("gemma2", head_dim=16))
    assert shape.norms_per_layer == 4
    assert shape.tie_embeddings
    assert shape.lm_head_params == 0


def test_baichuan2_13b_takes_its_context_from_model_max_length() -> None:
    assert load_shape("baichuan2-13b").max_position_embeddings == 4096


# Golden numbers printed by peft's `print_trainable_parameters()` for LoRA r=16 on all linear layers
# (widely quoted: "trainable params: 41,943,040 || all params: 8,072,204,288" for Llama-3-8B, and
# "39,976,960 || all params: 6,778,392,576" for Llama-2-7B).
@pytest.mark.parametrize(
    ("name", "trainable"),
    [("llama-3.1-8b", 41_943_040), ("mistral-7b-v0.3", 41_943_040), ("llama-2-7b", 39_976_960)],
)
def test_lora_params_match_peft_golden_numbers(name: str, trainable: int) -> None:
    assert load_shape(name).lora_params(16) == trainable


def test_incomplete_config_lists_every_problem() -> None:
    config = {"model_type": "llama", "hidden_size": 0, "num_attention_heads": 6, "num_key_value_heads": 4}
    with pytest.raises(ConfigError) as caught:
        shape_from_config(config, name="mine")
    assert caught.value.message == (
        "cannot read model config 'mine': 'hidden_size' must be a positive integer, got 0; "
        "'num_hidden_layers' must be a positive integer, got nothing; "
        "'vocab_size' must be a positive integer, got nothing; "
        "num_attention_heads=6 is not a multiple of num_key_value_heads=4"
    )


def test_unsupported_architecture_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"model_type 'gpt2' is not supported \(known: llama, mistral"):
        shape_from_config(tiny("gpt2"))


def test_moe_with_dense_layers_is_refused_rather_than_miscounted() -> None:
    config = tiny("qwen3_moe", num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0])
    with pytest.raises(ConfigError, match="MoE models with dense layers"):
        shape_from_config(config)


def test_multimodal_wrapper_reads_the_text_config() -> None:
    shape = shape_from_config({"model_type": "llava", "text_config": tiny("llama")})
    assert (shape.model_type, shape.hidden_size) == ("llama", 64)


def test_roles_describe_every_bundled_layer_whatever_its_name() -> None:
    from rentwise.models.catalog import list_models

    for entry in list_models():
        shape, lins = entry.shape, entry.shape.layer_linears()
        by_role = {role: [lin for lin in lins if lin.role == role] for role in {lin.role for lin in lins}}
        assert "other" not in by_role, entry.name
        assert sum(lin.out_features for lin in by_role["attn_in"]) == shape.q_dim + 2 * shape.kv_dim
        assert [lin.in_features for lin in by_role["attn_out"]] == [shape.q_dim]
        width = shape.moe_intermediate_size if shape.is_moe else shape.intermediate_size
        assert sum(lin.out_features for lin in by_role["mlp_in"]) == 2 * width, entry.name
        assert [lin.in_features for lin in by_role["mlp_out"]] == [width], entry.name
        assert ("router" in by_role) == shape.is_moe
