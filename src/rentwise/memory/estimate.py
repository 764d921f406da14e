"""The analytic estimator: peak GPU memory per device of one training step or one generation, broken down.

Training peak is taken over the phases of a steady-state step (step >= 2: optimizer state exists, gradients
were freed by `zero_grad(set_to_none=True)`): end of forward (inside the loss), start of backward (the
cross-entropy gradient spike), the recomputation of a checkpointed layer, and the optimizer step. Each phase's
bytes are the sum of the tensors alive then; the breakdown reports the phase with the most.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rentwise.memory.activations import (
    FP32,
    INT64,
    Dims,
    dims_for,
    layer_saved_bytes,
    linear_inputs_saved,
    lora_target_names,
    merged_expert_bytes,
    rmsnorm_saved,
)
from rentwise.memory.breakdown import MemoryBreakdown, Phase
from rentwise.memory.job import MemoryJob
from rentwise.memory.overhead import (
    ALLOCATOR_SLACK_FRACTION,
    CUBLAS_WORKSPACE_BYTES,
    CUDA_CONTEXT_BYTES,
    TRAINING_CUBLAS_WORKSPACES,
)
from rentwise.memory.parameters import ParameterBytes, parameter_bytes
from rentwise.models.shape import ModelShape

ALWAYS_LEFT_OUT = (
    "fragmentation beyond a flat 5% allocator slack (`--trace` simulates the allocator)",
    "fused or custom kernels (Liger, fused cross-entropy, torch.compile); stock Hugging Face modules assumed",
    "the data loader's pinned host buffers, CUDA graphs and NCCL's own buffers",
)


@dataclass(frozen=True)
class _Phase:
    name: Phase
    gradients: int = 0
    adapter_grads: int = 0
    activations: int = 0
    logits: int = 0
    kv_cache: int = 0
    temporaries: int = 0

    def total(self) -> int:
        parts = (self.gradients, self.adapter_grads, self.activations, self.logits, self.kv_cache)
        return sum(parts) + self.temporaries


# Model types whose transformers implementation refuses attn_implementation="sdpa" (transformers 5.x raises
# "does not support an attention implementation through torch.nn.functional.scaled_dot_product_attention").
NO_SDPA_TYPES = ("gemma2",)


def effective_job(shape: ModelShape, job: MemoryJob) -> MemoryJob:
    """The job as transformers would run it: sdpa falls back to eager where the model does not offer it."""
    if job.attention == "sdpa" and shape.model_type in NO_SDPA_TYPES:
        return dataclasses.replace(job, attention="eager")
    return job


def estimate_memory(shape: ModelShape, job: MemoryJob) -> MemoryBreakdown:
    """Estimate peak GPU memory per device for `job` on `shape` (pure arithmetic, microseconds)."""
    asked = job
    job = effective_job(shape, job)
    params = parameter_bytes(shape, job)
    phases = _training_phases(shape, job, params) if job.is_training else _inference_phases(shape, job)
    peak = max(phases, key=lambda p: p.total())
    static = params.weights + params.quant_constants + params.adapter + params.ddp_buckets
    static += params.optimizer if job.is_training else 0
    workspace = CUBLAS_WORKSPACE_BYTES * (TRAINING_CUBLAS_WORKSPACES if job.is_training else 1)
    allocated = static + peak.total() + workspace
    return MemoryBreakdown(
        weights_bytes=params.weights,
        gradients_bytes=peak.gradients + params.ddp_buckets,
        optimizer_bytes=params.optimizer if job.is_training else 0,
        activations_bytes=peak.activations,
        logits_bytes=peak.logits,
        kv_cache_bytes=peak.kv_cache,
        adapter_bytes=params.adapter + peak.adapter_grads,
        quant_constants_bytes=params.quant_constants,
        temporaries_bytes=peak.temporaries,
        workspace_bytes=workspace,
        allocator_slack_bytes=int(allocated * ALLOCATOR_SLACK_FRACTION),
        cuda_context_bytes=CUDA_CONTEXT_BYTES,
        peak_phase=peak.name,
        source="analytic",
        phase_peaks=tuple((p.name, static + p.total() + workspace) for p in phases),
        leaves_out=_leaves_out(shape, job) + _substitutions(asked, job),
    )


def _substitutions(asked: MemoryJob, used: MemoryJob) -> tuple[str, ...]:
    if asked.attention != used.attention:
        return (
            f"{asked.attention} attention: the model runs {used.attention} in transformers, estimated so",
        )
    return ()


def _leaves_out(shape: ModelShape, job: MemoryJob) -> tuple[str, ...]:
    notes = list(ALWAYS_LEFT_OUT)
    if job.is_training:
        notes.append("step 1 peaks lower: optimizer state is created at the first optimizer step")
    if shape.is_moe:
        notes.append("uneven expert routing (tokens assumed spread evenly over experts)")
    if job.method == "qlora":
        notes.append("peft's prepare_model_for_kbit_training fp32 upcast of embeddings and norms")
        if any(not lin.is_nn_linear for lin in shape.layer_linears()):
            notes.append(
                "4-bit MoE experts: bitsandbytes quantises nn.Linear only, so experts are counted in bf16"
            )
    if job.tensor_parallel > 1:
        notes.append("tensor parallel is applied as a plain divisor of weights and per-head activations")
    if job.num_gpus > 1:
        notes.append("communication buffers beyond DDP gradient buckets and ZeRO reduce buckets")
    return tuple(notes)


def _base_saved(shape: ModelShape, job: MemoryJob, d: Dims) -> int:
    """Saved tensors outside the decoder layers: embedding indices, final norm, lm_head input, RoPE tables,
    labels."""
    full = job.method == "full"
    t, h = d.tokens, shape.hidden_size
    saved = INT64 * t if full else 0  # embedding backward needs the token ids
    saved += rmsnorm_saved(d, t * h, True, full, shape.model_type in ("gemma", "gemma2")) + FP32 * t
    saved += linear_inputs_saved(d, t * h, d.residual, ("lm_head",), full, frozenset())
    rope_bytes = FP32 if d.autocast else d.compute
    saved += 2 * rope_bytes * d.seq * shape.head_dim  # cos and sin, shared by every layer (batch dim 1)
    saved += INT64 * t  # shifted labels
    return saved


def _activations(shape: ModelShape, job: MemoryJob, d: Dims) -> tuple[int, int]:
    """(saved bytes of all layers + the rest, bytes of one layer's saved tensors) for this job."""
    adapter_anywhere = bool(lora_target_names(shape, job))
    first = layer_saved_bytes(shape, job, d, input_requires_grad=job.grad_checkpointing and adapter_anywhere)
    rest = layer_saved_bytes(shape, job, d, input_requires_grad=adapter_anywhere)
    one_layer = max(first, rest)
    if job.grad_checkpointing:
        layers = shape.num_layers * d.residual * d.tokens * shape.hidden_size // 1  # each layer's input
    else:
        layers = first + (shape.num_layers - 1) * rest
    return layers + _base_saved(shape, job, d), one_layer


def _logits(shape: ModelShape, d: Dims, legacy: bool) -> tuple[int, int]:
    """(forward peak, backward peak) of the logits and HF's cross-entropy (loss_utils.ForCausalLMLoss).

    Forward: logits in the compute dtype, `.float()` copy, log_softmax output (saved). Backward: the saved
    log-probs, nll_loss's gradient and log_softmax's gradient, all fp32 (the bf16 logits were dropped with
    the model output, as in `loss = model(**batch).loss`).
    """
    tv = d.tokens * shape.vocab_size // d.tp
    if legacy:
        # fp32 logits held by the output + shifted contiguous copy + log-probs; backward adds two fp32 grads
        return 3 * FP32 * tv, 4 * FP32 * tv
    upcast = FP32 * tv if d.compute != FP32 else 0
    # Gemma 2's final_logit_softcapping: tanh keeps its output (compute dtype) until its backward
    softcap = d.compute * tv if shape.final_logit_softcapping else 0
    forward = d.compute * tv + upcast + FP32 * tv + softcap
    backward = 3 * FP32 * tv + softcap
    return forward, backward


def _training_phases(shape: ModelShape, job: MemoryJob, params: ParameterBytes) -> list[_Phase]:
    d = dims_for(job)
    activations, one_layer = _activations(shape, job, d)
    logits_fwd, logits_bwd = _logits(shape, d, job.legacy_logits)
    transient = params.autocast_copies + params.dequant_temporary + params.gather_buffers
    layer_grads = params.gradients // max(1, shape.num_layers)
    phases = [
        _Phase("forward", activations=activations, logits=logits_fwd, temporaries=transient),
        _Phase("backward", activations=activations, logits=logits_bwd, temporaries=transient),
    ]
    merged = merged_expert_bytes(shape, job, d)
    if merged:
        # backward through peft's merged expert weights: full-size gradients of the largest fused tensor
        # (the merged weight's, the base's and the delta's) live together; seen in the trace (Mixtral)
        largest = max(lin.in_features * lin.out_features * lin.copies for lin in shape.layer_linears())
        phases.append(
            _Phase(
                "backward",
                activations=activations,
                adapter_grads=params.adapter_grads,  # mostly the expert adapters' own gradients by then
                temporaries=transient + 3 * d.compute * largest // d.tp,
            )
        )
    if params.head_grad:
        # lm_head's backward: the logits gradient in the compute dtype, lm_head's weight gradient (bf16 first,
        # then cast to the fp32 .grad under AMP) and the hidden-state gradient, all activations still saved
        tv = d.tokens * shape.vocab_size // d.tp
        phases.append(
            _Phase(
                "backward",
                activations=activations,
                logits=d.compute * tv,
                gradients=params.head_grad,
                temporaries=transient + d.compute * d.tokens * shape.hidden_size,
            )
        )
    if job.grad_checkpointing:
        # the last layer to run backward is recomputed while nearly every gradient already exists
        kept = activations - (shape.num_layers - 1) * d.residual * d.tokens * shape.hidden_size
        recompute_transient = params.dequant_temporary + params.gather_buffers
        phases.append(
            _Phase(
                "backward",
                gradients=params.gradients - layer_grads,
                adapter_grads=params.adapter_grads,
                activations=kept + one_layer,
                temporaries=recompute_transient + params.reduce_buckets,
            )
        )
    if params.tied_grad_temporary:
        phases.append(_Phase("backward", gradients=params.gradients, temporaries=params.tied_grad_temporary))
    phases.append(
        _Phase(
            "optimizer_step",
            gradients=params.gradients,
            adapter_grads=params.adapter_grads,
            temporaries=params.optimizer_temporary + params.reduce_buckets,
        )
    )
    return phases


def _inference_phases(shape: ModelShape, job: MemoryJob) -> list[_Phase]:
    """Prefill of the prompt, then decoding to prompt + generate_len with a growing KV cache."""
    prompt = job.prompt_len
    d = dims_for(job, seq=prompt)
    t, h, c = d.tokens, shape.hidden_size, d.compute
    i = shape.moe_intermediate_size * shape.experts_per_token if shape.is_moe else shape.intermediate_size
    i //= d.tp
    q, kv = shape.q_dim // d.tp, shape.kv_dim // d.tp
    kv_per_token = 2 * shape.num_layers * kv * c * d.batch

    # live tensors inside one layer: residual + normed input + the wider of the MLP (act, up, product)
    # and attention (q, k, v, output; eager adds fp32 scores) working sets
    mlp = 3 * c * t * i
    attention = c * t * (2 * q + 2 * kv)
    if job.attention == "eager":
        attention += (FP32 + c) * (shape.num_heads // d.tp) * d.batch * prompt * prompt
    working = 2 * c * t * h + FP32 * t * h + max(mlp, attention)
    # generate() keeps the last position's logits and copies them to fp32 for sampling
    logits = d.batch * shape.vocab_size * (c + FP32) if job.generate_len else t * shape.vocab_size * c // d.tp
    prefill = _Phase("prefill", activations=working, logits=logits, kv_cache=kv_per_token * prompt)
    if not job.generate_len:
        return [prefill]
    total_len = prompt + job.generate_len
    # DynamicCache grows each layer with torch.cat: the old and new tensors of one layer coexist
    cat_transient = kv_per_token * total_len // shape.num_layers
    decode = _Phase(
        "decode",
        activations=2 * c * d.batch * h + 3 * c * d.batch * i,
        logits=logits,
        kv_cache=kv_per_token * total_len,
        temporaries=cat_transient,
    )
    return [prefill, decode]
