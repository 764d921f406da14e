"""`ModelShape`: the sizes of a decoder-only transformer, read from a Hugging Face `config.json` (no weights).

Everything the memory, time and cost models need is derived from these fields: parameter counts (exact, as
`AutoModelForCausalLM.from_config(...).numel()` counts them, checked by tests/unit/models), the linear layers
LoRA can target, and the per-layer tensor sizes that activations are made of.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rentwise.errors import ConfigError

NormKind = Literal["rmsnorm", "layernorm"]

# model_type values whose layers we know how to count. Remote-code architectures that are a Llama under
# other names (InternLM2's fused wqkv, Baichuan's W_pack) are mapped to llama sizes: fusing projections
# changes module names, not parameter counts.
SUPPORTED_TYPES = (
    "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "gemma", "gemma2",
    "phi3", "glm", "internlm2", "baichuan", "yi", "deepseek",
)  # fmt: skip


@dataclass(frozen=True)
class LinearLayer:
    """One linear projection inside a decoder layer (HF module name), per expert for MoE experts."""

    name: str
    in_features: int
    out_features: int
    has_bias: bool
    copies: int = 1  # experts: one per expert
    active_copies: int = 1  # experts: how many run per token


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a decoder-only transformer. Counts are exact; nothing here depends on weights."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    gated_mlp: bool = True
    norm: NormKind = "rmsnorm"
    norms_per_layer: int = 2  # gemma2 has four (pre/post attention and feed-forward)
    qk_norm: bool = False  # qwen3: RMSNorm over head_dim on q and k
    num_experts: int = 0  # 0 = dense
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    max_position_embeddings: int = 4096
    final_logit_softcapping: float | None = None
    source: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # --- parameter counts -------------------------------------------------------------------------------
    def layer_linears(self) -> tuple[LinearLayer, ...]:
        """The linear layers of one decoder layer, named as Hugging Face names them (unfused)."""
        h, hd = self.hidden_size, self.head_dim
        q_out, kv_out = self.num_heads * hd, self.num_kv_heads * hd
        layers = [
            LinearLayer("q_proj", h, q_out, self.qkv_bias),
            LinearLayer("k_proj", h, kv_out, self.qkv_bias),
            LinearLayer("v_proj", h, kv_out, self.qkv_bias),
            LinearLayer("o_proj", q_out, h, self.o_bias),
        ]
        if self.is_moe:
            e, k, i = self.num_experts, self.experts_per_token, self.moe_intermediate_size
            layers += [
                LinearLayer("experts.gate_proj", h, i, False, copies=e, active_copies=k),
                LinearLayer("experts.up_proj", h, i, False, copies=e, active_copies=k),
                LinearLayer("experts.down_proj", i, h, False, copies=e, active_copies=k),
                LinearLayer("router", h, e, False),
            ]
            if self.shared_expert_intermediate_size:
                s = self.shared_expert_intermediate_size
                layers += [
                    LinearLayer("shared_expert.gate_proj", h, s, False),
                    LinearLayer("shared_expert.up_proj", h, s, False),
                    LinearLayer("shared_expert.down_proj", s, h, False),
                    LinearLayer("shared_expert_gate", h, 1, False),
                ]
        else:
            i = self.intermediate_size
            if self.gated_mlp:
                layers.append(LinearLayer("gate_proj", h, i, self.mlp_bias))
            layers += [LinearLayer("up_proj", h, i, self.mlp_bias), LinearLayer("down_proj", i, h, self.mlp_bias)]
        return tuple(layers)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def _norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def layer_params(self, active_only: bool = False) -> int:
        """Parameters of one decoder layer (MoE: all experts, or only the routed `experts_per_token`)."""
        total = 0
        for lin in self.layer_linears():
            copies = lin.active_copies if (active_only and lin.copies > 1) else lin.copies
            total += copies * (lin.in_features * lin.out_features + (lin.out_features if lin.has_bias else 0))
        total += self.norms_per_layer * self._norm_params()
        if self.qk_norm:
            total += 2 * self.head_dim
        return total

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Output projection parameters; 0 when tied to the input embedding (shared storage)."""
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total parameters, counted as `sum(p.numel() for p in model.parameters())` counts them."""
        return (
            self.embedding_params
            + self.lm_head_params
            + self.num_layers * self.layer_params()
            + self._norm_params()  # final norm
        )

    @property
    def num_active_params(self) -> int:
        """Parameters used per token (differs from `num_params` only for MoE)."""
        return (
            self.embedding_params
            + self.lm_head_params
            + self.num_layers * self.layer_params(active_only=True)
            + self._norm_params()
        )

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim


def _first(config: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if key in config and config[key] is not None:
            return config[key]
    return default


def shape_from_config(config: Mapping[str, Any], name: str = "", source: str = "") -> ModelShape:
    """Build a `ModelShape` from a Hugging Face config.json dict; raise `ConfigError` listing every problem."""
    if "text_config" in config and "hidden_size" not in config:
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type", "")}
    model_type = str(config.get("model_type", "")).lower()
    problems: list[str] = []
    if model_type not in SUPPORTED_TYPES:
        problems.append(f"model_type '{model_type}' is not supported (known: {', '.join(SUPPORTED_TYPES)})")

    hidden = _first(config, "hidden_size", "n_embd", "d_model")
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(config, "num_attention_heads", "n_head")
    vocab = _first(config, "vocab_size", "padded_vocab_size")
    for key, value in (("hidden_size", hidden), ("num_hidden_layers", layers),
                       ("num_attention_heads", heads), ("vocab_size", vocab)):  # fmt: skip
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            problems.append(f"'{key}' must be a positive integer, got {value!r}")
    if problems:
        raise ConfigError(
            f"cannot read model config{f' {name!r}' if name else ''}: " + "; ".join(problems),
            hint="pass a Hugging Face config.json of a decoder-only model, or a bundled name from `rentwise models`",
        )
    kv_heads = int(_first(config, "num_key_value_heads", "multi_query_group_num", default=heads))
    head_dim = int(_first(config, "head_dim", "kv_channels", default=hidden // heads))
    intermediate = int(_first(config, "intermediate_size", "ffn_hidden_size", default=4 * hidden))
    if heads % kv_heads:
        raise ConfigError(
            f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}",
            hint="check the config.json",
        )

    is_qwen2 = model_type in ("qwen2", "qwen2_moe")
    qkv_bias = bool(_first(config, "attention_bias", "qkv_bias", "add_qkv_bias", default=is_qwen2))
    if model_type == "glm":
        qkv_bias = bool(config.get("attention_bias", True))
    # Llama/Mistral/InternLM2 'attention_bias' adds a bias to o_proj too; Qwen2 and GLM put bias on q/k/v only.
    o_bias = qkv_bias and model_type in ("llama", "mistral", "internlm2", "yi", "deepseek")
    if model_type == "internlm2":
        qkv_bias = o_bias = bool(config.get("bias", False))
    num_experts = int(_first(config, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0)
    tie = bool(config.get("tie_word_embeddings", model_type in ("gemma", "gemma2")))
    return ModelShape(
        name=name or str(config.get("_name_or_path", model_type)),
        model_type=model_type,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tie_embeddings=tie,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=bool(config.get("mlp_bias", False)),
        norms_per_layer=4 if model_type == "gemma2" else 2,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        num_experts=num_experts,
        experts_per_token=int(_first(config, "num_experts_per_tok", default=0) or 0) if num_experts else 0,
        moe_intermediate_size=int(_first(config, "moe_intermediate_size", default=intermediate))
        if num_experts
        else 0,
        shared_expert_intermediate_size=int(config.get("shared_expert_intermediate_size", 0) or 0),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        final_logit_softcapping=config.get("final_logit_softcapping"),
        source=source,
        extra=dict(config),
    )
