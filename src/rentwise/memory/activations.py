"""Activation bytes of a Hugging Face decoder, op by op, as PyTorch autograd actually saves them.

Each term names the tensor autograd keeps for backward. They were read off real CPU steps of
transformers 5.x Llama-family models with `torch.autograd.graph.saved_tensors_hooks` (bf16, fp32 and
autocast; full and LoRA; sdpa and eager); `rentwise memory --trace` re-checks any config. Two rules of
autograd's codegen drive most of it: an op saves an input only when the gradient of *another* input that
requires grad needs it (so frozen weights save far less), and views share storage (counted once).

Compared with Korthikanti et al. 2022 (`s*b*h*(34 + 5*a*s/h)` for GPT-3 with eager attention), HF models
keep an fp32 copy in every RMSNorm and four `intermediate_size` tensors in the gated MLP.
"""

from __future__ import annotations

from dataclasses import dataclass

from rentwise.memory.job import ALL_LINEAR, MemoryJob
from rentwise.models.shape import ModelShape

FP32 = 4
INT64 = 8


@dataclass(frozen=True)
class Dims:
    """Token-level sizes of one micro-batch and the byte widths that apply to this job."""

    batch: int
    seq: int
    compute: int
    """Bytes of matmul outputs: 2 (bf16/fp16, also under autocast) or 4 (fp32)."""
    residual: int
    """Bytes of the residual stream: 4 under autocast (fp32 weights) or fp32, else 2."""
    autocast: bool
    tp: int
    """Tensor-parallel degree: per-head and per-intermediate tensors are split across it."""
    lora_rank: int
    lora_dropout: bool

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def adapter_io(self) -> int:
        """Bytes of an adapter's saved input: bf16 casts under autocast, else peft's fp32 adapter dtype."""
        return 2 if self.autocast else FP32


def dims_for(job: MemoryJob, seq: int | None = None, batch: int | None = None) -> Dims:
    autocast = job.precision.startswith("amp")
    return Dims(
        batch=batch or job.micro_batch,
        seq=seq or job.seq_len,
        compute=4 if job.precision == "fp32" else 2,
        residual=4 if (autocast or job.precision == "fp32") else 2,
        autocast=autocast,
        tp=job.tensor_parallel,
        lora_rank=job.lora_rank,
        lora_dropout=job.lora_dropout > 0,
    )


def lora_target_names(shape: ModelShape, job: MemoryJob) -> frozenset[str]:
    """Decoder-layer weights that carry a LoRA adapter: peft's 'all-linear' set, or the names given
    (matched on the full name or its last part, as peft's `target_modules` suffix match does)."""
    if not job.uses_adapter:
        return frozenset()
    linears = shape.layer_linears()
    if ALL_LINEAR in job.lora_targets:
        return frozenset(lin.name for lin in linears if lin.is_all_linear_target)
    wanted = set(job.lora_targets)
    return frozenset(lin.name for lin in linears if lin.name in wanted or lin.name.split(".")[-1] in wanted)


def _names(shape: ModelShape, role: str) -> tuple[str, ...]:
    return tuple(lin.name for lin in shape.layer_linears() if lin.role == role)


def linear_inputs_saved(d: Dims, elems: int, input_bytes: int, consumers: tuple[str, ...], full: bool,
                        targets: frozenset[str]) -> int:  # fmt: skip
    """Bytes saved for the input of linears that read the same tensor (`elems` values of `input_bytes`).

    Full fine-tune: the weight gradient needs the input. Without autocast all consumers share one tensor;
    under autocast each consumer saves its own bf16 cast (autocast caches casts of leaf weights only), unless
    the input is bf16 already. LoRA: the frozen base saves nothing; each adapter's lora_A saves its input cast
    to the adapter dtype (peft `_cast_input_dtype`: fp32 adapters, or a bf16 autocast copy), shared only when
    no cast is needed; lora_B saves lora_A's (tokens x rank) output. With lora_dropout > 0 each adapter
    keeps a dropout output plus a one-byte mask instead.
    """
    saved = 0
    if full:
        copies = len(consumers) if (d.autocast and input_bytes != 2) else 1
        saved += copies * (2 if d.autocast else input_bytes) * elems
    adapted = [c for c in consumers if c in targets]
    if adapted:
        needs_cast = input_bytes != d.adapter_io
        if d.lora_dropout:
            saved += len(adapted) * (d.adapter_io + 1) * elems
        elif needs_cast:
            saved += len(adapted) * d.adapter_io * elems
        elif not full:
            saved += input_bytes * elems  # the shared input itself, kept alive by the adapters
        saved += len(adapted) * d.adapter_io * d.tokens * d.lora_rank
    return saved


def rmsnorm_saved(d: Dims, elems: int, input_requires_grad: bool, weight_requires_grad: bool,
                  fp32_weight_product: bool = False) -> int:  # fmt: skip
    """HF RMSNorm: x.float() (the input itself when already fp32) and rsqrt for d/dx; the normalised
    value for d/dweight, in the input dtype (Llama) or fp32 (Gemma multiplies by 1 + weight in fp32).
    The caller adds rsqrt's one fp32 per token."""
    saved = 0
    if input_requires_grad:
        saved += FP32 * elems
    if weight_requires_grad:
        saved += (FP32 if fp32_weight_product else d.residual) * elems
    return saved


def layer_saved_bytes(shape: ModelShape, job: MemoryJob, d: Dims, input_requires_grad: bool) -> int:
    """Bytes autograd saves for one decoder layer (no recomputation)."""
    full = job.method == "full"
    targets = lora_target_names(shape, job)
    t, h = d.tokens, shape.hidden_size
    q, kv = shape.q_dim // d.tp, shape.kv_dim // d.tp
    heads = shape.num_heads // d.tp
    c = d.compute
    gemma = shape.model_type in ("gemma", "gemma2")
    attn_in, attn_out = _names(shape, "attn_in"), _names(shape, "attn_out")
    mlp_in, mlp_out = _names(shape, "mlp_in"), _names(shape, "mlp_out")

    def norm(grad: bool) -> int:
        return rmsnorm_saved(d, t * h, grad, full, gemma) + (FP32 * t if grad else 0)

    saved = 0
    # 1. attention: input norm, q/k/v inputs, the attention kernel's saved tensors, o_proj's input
    grad_in = full or input_requires_grad
    saved += norm(grad_in)
    saved += linear_inputs_saved(d, t * h, d.residual, attn_in, full, targets)
    qkv_grad = grad_in or bool(targets & set(attn_in))
    if qkv_grad:
        if (
            shape.qk_norm
        ):  # Qwen3: RMSNorm over head_dim on q and k (fp32 copy + rsqrt, normalised for weight)
            saved += (FP32 + (c if full else 0)) * t * (q + kv) + FP32 * t * (heads + shape.num_kv_heads)
        saved += attention_saved(shape, job, d)
    adapted_out = bool(targets & set(attn_out))
    saved += o_proj_input_saved(d, t * q, c, job.attention == "eager", full, adapted_out)
    grad_mid = qkv_grad or adapted_out
    if shape.norms_per_layer == 4:  # Gemma 2 normalises the attention output before the residual add
        saved += norm(grad_mid)

    # 2. MLP: post-attention norm, gate/up inputs, the gated product's saved tensors, down_proj's input
    saved += norm(grad_mid)
    if shape.is_moe:
        saved += moe_saved(shape, job, d, grad_mid, targets)
    else:
        i = shape.intermediate_size // d.tp
        saved += linear_inputs_saved(d, t * h, d.residual, mlp_in, full, targets)
        if grad_mid or targets & set(mlp_in):
            saved += 3 * c * t * i  # act(gate) saves gate; gate*up saves act(gate) and up
        if full or targets & set(mlp_out):
            saved += linear_inputs_saved(d, t * i, c, mlp_out, full, targets)
    if shape.norms_per_layer == 4:  # ... and the MLP output
        saved += norm(grad_mid)
    return saved


def o_proj_input_saved(d: Dims, elems: int, c: int, eager: bool, full: bool, adapted: bool) -> int:
    """o_proj's input: sdpa's output is already laid out as (batch, seq, heads*dim) and was counted with the
    kernel; eager attention makes a contiguous copy, kept when the base weight or the adapter needs it."""
    saved = c * elems if (eager and full) else 0
    if adapted:
        if d.lora_dropout:
            saved += (d.adapter_io + 1) * elems
        elif c != d.adapter_io:
            saved += d.adapter_io * elems
        elif eager and not full:
            saved += c * elems
        saved += d.adapter_io * d.tokens * d.lora_rank
    return saved


def attention_saved(shape: ModelShape, job: MemoryJob, d: Dims) -> int:
    """Tensors the attention kernel keeps: post-RoPE q, k and v (+ output and logsumexp for sdpa/flash;
    fp32 softmax and its cast probabilities, heads x seq^2, for eager)."""
    t, c = d.tokens, d.compute
    q, kv = shape.q_dim // d.tp, shape.kv_dim // d.tp
    heads = shape.num_heads // d.tp
    if job.attention == "eager":
        kv_rep = q if shape.num_kv_heads != shape.num_heads else kv  # repeat_kv copies k and v to all heads
        scores = heads * d.batch * d.seq * d.seq
        probs = 0 if c == FP32 else c * scores  # .to(query dtype) is a no-op in fp32
        softcap = (
            c * scores if shape.extra.get("attn_logit_softcapping") else 0
        )  # Gemma 2: tanh keeps its output
        return c * t * (q + 2 * kv_rep) + FP32 * scores + probs + softcap
    # sdpa / flash: q, k, v, output, logsumexp (fp32, batch x heads x seq)
    return c * t * (2 * q + 2 * kv) + FP32 * d.batch * heads * d.seq


def moe_saved(shape: ModelShape, job: MemoryJob, d: Dims, grad_mid: bool, targets: frozenset[str]) -> int:
    """Mixture of experts (transformers 5 fused experts): router input and fp32 softmax; per routed token
    the fused gate_up output (kept by act(gate) through its view), act(gate) and the expert output (kept by
    the routing-weight product); trainable experts also keep the gathered input and the gated product.
    Approximation: routing is assumed perfectly balanced."""
    full = job.method == "full"
    t, h, c = d.tokens, shape.hidden_size, d.compute
    i = shape.moe_intermediate_size // d.tp
    routed = t * shape.experts_per_token
    experts_train = full or bool(targets & {lin.name for lin in shape.layer_linears() if lin.copies > 1})
    saved = linear_inputs_saved(d, t * h, d.residual, _names(shape, "router"), full, targets)
    if grad_mid:
        saved += FP32 * t * shape.num_experts  # softmax over router logits
        saved += c * routed * ((2 * h + 4 * i) if experts_train else (h + 3 * i))
    if shape.shared_expert_intermediate_size:
        saved += 4 * c * t * shape.shared_expert_intermediate_size // d.tp
    return saved + merged_expert_bytes(shape, job, d)


def merged_expert_bytes(shape: ModelShape, job: MemoryJob, d: Dims) -> int:
    """peft adapts transformers 5's fused 3-D expert tensors (ParamWrapper) by building each layer's merged
    weight W + B·A in the compute dtype and keeping it for backward: one extra copy of every adapted expert
    tensor per layer (seen in the fake-tensor trace of Mixtral with target_modules='all-linear')."""
    targets = lora_target_names(shape, job)
    adapted = [lin for lin in shape.layer_linears() if lin.copies > 1 and lin.name in targets]
    return d.compute * sum(lin.copies * lin.in_features * lin.out_features for lin in adapted) // d.tp
