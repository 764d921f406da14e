"""`ModelShape`: the sizes of a decoder-only transformer, read from a Hugging Face `config.json` (no weights).

Everything the memory, time and cost models need is derived from these fields: parameter counts (exact, as
`sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())` counts them in transformers 5.x,
checked for every bundled config by tests/unit/models/test_shape_vs_transformers.py), the layers LoRA can
target, and the per-layer tensor sizes that activations are made of.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rentwise.errors import ConfigError

NormKind = Literal["rmsnorm", "layernorm"]
LinearRole = Literal["attn_in", "attn_out", "mlp_in", "mlp_out", "router", "shared_gate", "other"]

# model_type values whose layers we know how to count. Remote-code architectures that are a Llama under
# other names (InternLM2's fused wqkv, Baichuan2's W_pack and NormHead) have exactly a Llama's parameter
# count: fusing projections changes module names, not sizes. Yi and DeepSeek-LLM ship as model_type "llama".
SUPPORTED_TYPES = (
    "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "gemma", "gemma2",
    "phi3", "glm", "internlm2", "baichuan", "yi", "deepseek",
)  # fmt: skip

# transformers 5.x bias rules, read from each modeling_<type>.py:
# - q/k/v and o follow `attention_bias` together: llama, qwen3, qwen3_moe, gemma, gemma2 (InternLM2: `bias`).
# - q/k/v only, o never: qwen2 (always on), qwen2_moe (`qkv_bias`, default on), glm (`attention_bias`,
#   default on).
# - never: mistral, mixtral, phi3, baichuan.
_QKV_AND_O_BIAS = ("llama", "qwen3", "qwen3_moe", "gemma", "gemma2", "internlm2", "yi", "deepseek")
# MoE types whose fused experts and router peft 0.21.2's "all-linear" reaches: those transformers 5.24's
# conversion_mapping knows (qwen3_moe) plus the one peft adds (mixtral). qwen2_moe is missing from both.
_PEFT_ALL_LINEAR_REACHES_EXPERTS = ("mixtral", "qwen3_moe")
_TIED_BY_DEFAULT = ("gemma", "gemma2")  # transformers' config defaults; every other type defaults to untied


@dataclass(frozen=True)
class LinearLayer:
    """One weight matrix inside a decoder layer, named as the Hugging Face module (or parameter) names it.

    MoE experts and routers are not `nn.Linear` modules in transformers 5.x (`is_nn_linear=False`): all
    experts of a layer are one 3-D `nn.Parameter` (`experts.gate_up_proj`: experts x 2*moe_intermediate x
    hidden; `experts.down_proj`) and the router is a bare (experts x hidden) `nn.Parameter` (`gate.weight`).
    peft 0.21 still adapts them under `target_modules="all-linear"` for the model types transformers'
    `conversion_mapping` lists (mixtral, qwen3_moe; not qwen2_moe): it maps the transformers-4 names
    (w1/w3/w2, gate_proj/up_proj/down_proj, gate) onto these parameters (`target_parameters`) and wraps each
    in a `ParamWrapper` with a rank-(r x experts) LoRA, doubling r on the fused `gate_up_proj`
    (`lora_rank_factor=2`). For other MoE types (and, unverified here, peft without this mapping) experts and
    router stay frozen (`is_all_linear_target=False`). Verified against peft 0.21.2 + transformers 5.24 in
    tests/unit/models/test_shape_vs_transformers.py.
    """

    name: str
    in_features: int
    out_features: int
    has_bias: bool
    copies: int = 1  # experts: one per expert
    active_copies: int = 1  # experts: how many run per token
    is_nn_linear: bool = True
    is_all_linear_target: bool = True  # adapted by peft's target_modules="all-linear"
    lora_rank_factor: int = 1  # peft's rank multiplier for this weight (2 on fused MoE gate_up_proj)
    role: LinearRole = "other"
    """Which tensor it reads and writes, whatever the architecture names it: attn_in (q/k/v, fused or not,
    read the normed hidden state), attn_out (o_proj/wo), mlp_in (gate/up, fused or not, experts' gate_up),
    mlp_out (down/w2), router, shared_gate (qwen2_moe's sigmoid gate on the shared expert)."""

    @property
    def params(self) -> int:
        """Parameters of one copy: weight plus bias."""
        return self.in_features * self.out_features + (self.out_features if self.has_bias else 0)


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
    hf_id: str = ""  # Hugging Face repo id, when known (bundled models)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # --- parameter counts -------------------------------------------------------------------------------
    def layer_linears(self) -> tuple[LinearLayer, ...]:
        """The weight matrices of one decoder layer, under the module names peft's `target_modules` match.

        Fused projections keep their fused names and sizes (phi3 `qkv_proj` and `gate_up_proj`, glm
        `gate_up_proj`, internlm2 `wqkv`/`w1`/`w3`/`w2`, baichuan `W_pack`), because peft wraps the fused
        module as one layer and LoRA's size depends on it.
        """
        return self._attention_linears() + self._mlp_linears()

    def _attention_linears(self) -> tuple[LinearLayer, ...]:
        h, q_out, kv_out, bias = self.hidden_size, self.q_dim, self.kv_dim, self.qkv_bias
        o_name = "wo" if self.model_type == "internlm2" else "o_proj"
        o_proj = LinearLayer(o_name, q_out, h, self.o_bias, role="attn_out")
        fused_name = {"phi3": "qkv_proj", "internlm2": "wqkv", "baichuan": "W_pack"}.get(self.model_type)
        if fused_name:
            return (LinearLayer(fused_name, h, q_out + 2 * kv_out, bias, role="attn_in"), o_proj)
        return (
            LinearLayer("q_proj", h, q_out, bias, role="attn_in"),
            LinearLayer("k_proj", h, kv_out, bias, role="attn_in"),
            LinearLayer("v_proj", h, kv_out, bias, role="attn_in"),
            o_proj,
        )

    def _mlp_linears(self) -> tuple[LinearLayer, ...]:
        h, i, bias = self.hidden_size, self.intermediate_size, self.mlp_bias
        if self.is_moe:
            return self._moe_linears()
        down_name = "w2" if self.model_type == "internlm2" else "down_proj"
        down = LinearLayer(down_name, i, h, bias, role="mlp_out")
        if self.model_type in ("phi3", "glm"):
            return (LinearLayer("gate_up_proj", h, 2 * i, bias, role="mlp_in"), down)
        gate_name, up_name = ("w1", "w3") if self.model_type == "internlm2" else ("gate_proj", "up_proj")
        gate = (LinearLayer(gate_name, h, i, bias, role="mlp_in"),) if self.gated_mlp else ()
        return (*gate, LinearLayer(up_name, h, i, bias, role="mlp_in"), down)

    def _moe_linears(self) -> tuple[LinearLayer, ...]:
        h, e, k, i = self.hidden_size, self.num_experts, self.experts_per_token, self.moe_intermediate_size
        adapted = self.model_type in _PEFT_ALL_LINEAR_REACHES_EXPERTS
        fused: dict[str, Any] = {"is_nn_linear": False, "is_all_linear_target": adapted}
        layers = [
            # transformers>=5 fuses each layer's experts into 3-D parameters (see LinearLayer).
            LinearLayer(
                "experts.gate_up_proj", h, 2 * i, False, e, k, lora_rank_factor=2, role="mlp_in", **fused
            ),
            LinearLayer("experts.down_proj", i, h, False, e, k, role="mlp_out", **fused),
            LinearLayer("gate", h, e, False, role="router", **fused),  # a bare (experts x hidden) weight
        ]
        if self.shared_expert_intermediate_size:  # qwen2_moe: one always-on expert, gated by a sigmoid
            s = self.shared_expert_intermediate_size
            layers += [
                LinearLayer("shared_expert.gate_proj", h, s, False, role="mlp_in"),
                LinearLayer("shared_expert.up_proj", h, s, False, role="mlp_in"),
                LinearLayer("shared_expert.down_proj", s, h, False, role="mlp_out"),
                LinearLayer("shared_expert_gate", h, 1, False, role="shared_gate"),
            ]
        return tuple(layers)

    def lora_params(self, rank: int) -> int:
        """Trainable parameters of a LoRA adapter of `rank` on every decoder-layer weight (no LoRA bias).

        This is what peft 0.21's `target_modules="all-linear"` creates: the `layer_linears()` marked
        `is_all_linear_target`, never the LM head. Each adds A (rank x in) and B (out x rank), per expert.
        """
        per_layer = sum(
            lin.lora_rank_factor * rank * lin.copies * (lin.in_features + lin.out_features)
            for lin in self.layer_linears()
            if lin.is_all_linear_target
        )
        return self.num_layers * per_layer

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
            total += copies * lin.params
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


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _problems(config: Mapping[str, Any], model_type: str) -> list[str]:
    """Every reason `config` cannot be read, so one error can list them all (STYLE.md §5)."""
    problems: list[str] = []
    if model_type not in SUPPORTED_TYPES:
        known = ", ".join(SUPPORTED_TYPES)
        problems.append(f"model_type {model_type or '(missing)'!r} is not supported (known: {known})")
    required = {
        "hidden_size": _first(config, "hidden_size", "n_embd", "d_model"),
        "num_hidden_layers": _first(config, "num_hidden_layers", "n_layer", "num_layers"),
        "num_attention_heads": _first(config, "num_attention_heads", "n_head"),
        "vocab_size": _first(config, "vocab_size", "padded_vocab_size"),
    }
    optional = {key: config.get(key) for key in _OPTIONAL_INTS if config.get(key) is not None}
    for key, value in {**required, **optional}.items():
        if not _is_positive_int(value):
            got = "nothing" if value is None else repr(value)
            problems.append(f"'{key}' must be a positive integer, got {got}")
    heads, kv_heads = required["num_attention_heads"], optional.get("num_key_value_heads", 0)
    if _is_positive_int(heads) and _is_positive_int(kv_heads) and heads % kv_heads:
        problems.append(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    if config.get("mlp_only_layers") or int(config.get("decoder_sparse_step", 1) or 1) != 1:
        # Layers that mix dense and MoE MLPs would need per-layer sizes; every bundled MoE is all-sparse.
        problems.append(
            "MoE models with dense layers (mlp_only_layers, decoder_sparse_step > 1) are not supported"
        )
    return problems


_OPTIONAL_INTS = (
    "num_key_value_heads", "head_dim", "intermediate_size", "num_local_experts", "num_experts",
    "num_experts_per_tok", "moe_intermediate_size", "max_position_embeddings",
)  # fmt: skip


def _biases(config: Mapping[str, Any], model_type: str) -> tuple[bool, bool]:
    """(q/k/v bias, o bias) under transformers 5.x's rules for `model_type` (see `_QKV_AND_O_BIAS`)."""
    if model_type == "qwen2":
        return True, False
    if model_type == "qwen2_moe":
        return bool(config.get("qkv_bias", True)), False
    if model_type == "glm":
        return bool(config.get("attention_bias", True)), False
    if model_type == "internlm2":
        bias = bool(config.get("bias", False))
        return bias, bias
    if model_type in _QKV_AND_O_BIAS:
        bias = bool(config.get("attention_bias", False))
        return bias, bias
    return False, False


def shape_from_config(
    config: Mapping[str, Any], name: str = "", source: str = "", hf_id: str = ""
) -> ModelShape:
    """Build a `ModelShape` from a Hugging Face config.json dict; `ConfigError` lists every problem."""
    if "text_config" in config and "hidden_size" not in config:
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type", "")}
    model_type = str(config.get("model_type", "")).lower()
    problems = _problems(config, model_type)
    if problems:
        raise ConfigError(
            f"cannot read model config{f' {name!r}' if name else ''}: " + "; ".join(problems),
            hint="pass a Hugging Face config.json of a decoder-only model, "
            "or a bundled name from `rentwise models`",
        )
    hidden = int(_first(config, "hidden_size", "n_embd", "d_model"))
    heads = int(_first(config, "num_attention_heads", "n_head"))
    intermediate = int(_first(config, "intermediate_size", "ffn_hidden_size", default=4 * hidden))
    num_experts = int(_first(config, "num_local_experts", "num_experts", "n_routed_experts", default=0))
    qkv_bias, o_bias = _biases(config, model_type)
    return ModelShape(
        name=name or str(config.get("_name_or_path", model_type)),
        model_type=model_type,
        hidden_size=hidden,
        num_layers=int(_first(config, "num_hidden_layers", "n_layer", "num_layers")),
        num_heads=heads,
        num_kv_heads=int(_first(config, "num_key_value_heads", "multi_query_group_num", default=heads)),
        head_dim=int(_first(config, "head_dim", "kv_channels", default=hidden // heads)),
        intermediate_size=intermediate,
        vocab_size=int(_first(config, "vocab_size", "padded_vocab_size")),
        tie_embeddings=bool(config.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=bool(config.get("mlp_bias", False)) and model_type in ("llama", "yi", "deepseek"),
        norms_per_layer=4 if model_type == "gemma2" else 2,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        num_experts=num_experts,
        experts_per_token=int(_first(config, "num_experts_per_tok", default=0)) if num_experts else 0,
        moe_intermediate_size=int(_first(config, "moe_intermediate_size", default=intermediate))
        if num_experts
        else 0,
        shared_expert_intermediate_size=int(config.get("shared_expert_intermediate_size", 0) or 0)
        if model_type == "qwen2_moe"
        else 0,
        # Baichuan2-13B uses ALiBi and states only model_max_length.
        max_position_embeddings=int(
            _first(config, "max_position_embeddings", "model_max_length", "seq_length", default=4096)
        ),
        final_logit_softcapping=config.get("final_logit_softcapping"),
        source=source,
        hf_id=hf_id,
        extra=dict(config),
    )
