"""Bytes held per parameter: weights, QLoRA constants, gradients, optimizer states, LoRA adapters.

Sources: Adam keeps two moments per parameter in the parameter's dtype (torch.optim.AdamW); DeepSpeed ZeRO's
mixed precision keeps bf16/fp16 params and grads plus fp32 master weights and moments, K = 12 bytes of
optimizer state per parameter (Rajbhandari et al. 2020, ZeRO, §3); bitsandbytes 8-bit Adam keeps two uint8
states with one fp32 absmax per 256-value block (Dettmers et al. 2022, 8-bit optimizers); HF Adafactor
(beta1=None default) keeps row and column second-moment factors for matrices, a full fp32 vector for vectors
(Shazeer & Stern 2018); QLoRA NF4 packs two 4-bit values per byte with one absmax per 64 values, 8-bit absmax
+ one fp32 per 256 blocks under double quantisation (Dettmers et al. 2023, QLoRA §2; bitsandbytes
Linear4bit); peft keeps adapters in fp32 when the base is bf16/fp16 (`autocast_adapter_dtype=True`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rentwise.memory.activations import lora_target_names
from rentwise.memory.job import MemoryJob
from rentwise.models.shape import ModelShape

NF4_BLOCK = 64  # values per absmax block (bitsandbytes blocksize for 4-bit)
DQ_BLOCK = 256  # absmax values per second-level fp32 constant under double quantisation
ADAM8BIT_BLOCK = 256  # bitsandbytes blockwise 8-bit optimizer state block
# Per quantised tensor: the 16-value NF4 code table (fp32) and, with double quantisation, the 256-value
# dynamic 8-bit code plus an fp32 offset (bitsandbytes QuantState).
NF4_CODE_BYTES = 16 * 4
DQ_CODE_BYTES = 256 * 4 + 4


@dataclass(frozen=True)
class ParameterBytes:
    """Per-device bytes that scale with the parameter count (before activations)."""

    weights: int
    quant_constants: int
    gradients: int
    optimizer: int
    adapter: int  # adapter weights + optimizer states (always resident)
    adapter_grads: int  # adapter gradients: they exist from backward to the optimizer step
    optimizer_temporary: int  # foreach AdamW's sqrt(exp_avg_sq) copy during the step
    autocast_copies: int  # bf16 casts of linear weights kept from forward to backward under autocast
    dequant_temporary: int  # QLoRA: one dequantised bf16 weight at a time
    gather_buffers: int  # ZeRO-3/FSDP: unsharded layers in flight (current + prefetched)
    ddp_buckets: int  # DDP gradient buckets (a second copy of trainable grads)
    tied_grad_temporary: int  # tied embeddings: the embedding's dense grad before it is added to lm_head's
    head_grad: int  # full fine-tune: lm_head weight grad, the first backward makes (+ bf16 copy under AMP)
    reduce_buckets: int  # ZeRO-2/3 gradient reduce bucket


def linear_weight_params(shape: ModelShape) -> int:
    """Weights of every decoder-layer linear (the matmul weights autocast casts)."""
    return shape.num_layers * sum(
        lin.copies * lin.in_features * lin.out_features for lin in shape.layer_linears()
    )


def quantised_weight_params(shape: ModelShape) -> int:
    """Weights bitsandbytes 4-bit replaces: `nn.Linear` modules only (biases stay bf16). Transformers 5
    stores MoE experts and routers as bare 3-D/2-D parameters, so they stay in bf16 under QLoRA."""
    linears = [lin for lin in shape.layer_linears() if lin.is_nn_linear]
    return shape.num_layers * sum(lin.copies * lin.in_features * lin.out_features for lin in linears)


def linear_tensor_count(shape: ModelShape) -> int:
    """Quantised weight tensors (each carries its own NF4 code table)."""
    return shape.num_layers * sum(lin.copies for lin in shape.layer_linears() if lin.is_nn_linear)


def adapter_params(shape: ModelShape, job: MemoryJob) -> int:
    """LoRA A (rank x in) and B (out x rank) for every targeted linear in every layer (peft doubles the
    rank on fused MoE gate_up tensors: `lora_rank_factor`)."""
    targets = lora_target_names(shape, job)
    per_layer = sum(
        lin.copies * lin.lora_rank_factor * job.lora_rank * (lin.in_features + lin.out_features)
        for lin in shape.layer_linears()
        if lin.name in targets
    )
    return shape.num_layers * per_layer


def _state_bytes_per_param(job: MemoryJob, param_bytes: int) -> float:
    if job.optimizer in ("adamw", "adamw_fused"):
        return 2 * param_bytes
    if job.optimizer == "adamw_8bit":
        return 2 + 2 * 4 / ADAM8BIT_BLOCK
    if job.optimizer == "sgd_momentum":
        return param_bytes
    return 0  # sgd; adafactor is counted from the matrix shapes


def _adafactor_state(shape: ModelShape) -> int:
    """Row + column fp32 factors for every matrix, a full fp32 vector for every vector parameter."""
    per_layer = sum(lin.copies * (lin.in_features + lin.out_features) for lin in shape.layer_linears())
    vectors = shape.layer_params() - sum(lin.copies * lin.in_features * lin.out_features
                                         for lin in shape.layer_linears())  # fmt: skip
    embed = shape.vocab_size + shape.hidden_size
    head = 0 if shape.tie_embeddings else embed
    return 4 * (shape.num_layers * (per_layer + vectors) + embed + head + shape.hidden_size)


def _largest_tensor(shape: ModelShape) -> int:
    """Elements of the largest single parameter: the embedding, or a (fused) linear."""
    largest_linear = max(lin.in_features * lin.out_features * (lin.copies if not lin.is_nn_linear else 1)
                         for lin in shape.layer_linears())  # fmt: skip
    return max(shape.vocab_size * shape.hidden_size, largest_linear)


def parameter_bytes(shape: ModelShape, job: MemoryJob) -> ParameterBytes:
    """Bytes per device for weights, gradients, optimizer states and the buffers that go with them."""
    n = shape.num_params
    tp = job.tensor_parallel
    dp = job.data_parallel
    deepspeed = job.sharding in ("zero1", "zero2", "zero3")
    autocast = job.precision.startswith("amp")
    wide = job.precision == "fp32" or autocast  # parameters stored in fp32
    compute = 4 if job.precision == "fp32" else 2
    linear_w = linear_weight_params(shape)

    # 1. base weights
    if job.method == "qlora":
        quantised = quantised_weight_params(shape)
        weights = quantised // 2 + (n - quantised) * 2
        blocks = -(-quantised // NF4_BLOCK)
        tensors = linear_tensor_count(shape)
        if job.qlora_double_quant:
            quant = blocks + 4 * -(-blocks // DQ_BLOCK) + tensors * (NF4_CODE_BYTES + DQ_CODE_BYTES)
        else:
            quant = 4 * blocks + tensors * NF4_CODE_BYTES
    else:
        param_bytes = 2 if (deepspeed and autocast and job.method == "full") else (4 if wide else 2)
        weights, quant = n * param_bytes, 0

    # 2. what trains: all parameters (full) or the adapters
    gradients = optimizer = opt_temp = ddp = reduce = tied = head = 0
    adapter_parts = [0, 0, 0]  # LoRA weights, grads, states: sharded like the full model's
    trainable = 0
    if job.method == "full":
        param_bytes = 4 if wide else 2
        grad_bytes = 2 if (deepspeed and autocast) else param_bytes
        gradients = n * grad_bytes
        head = shape.vocab_size * shape.hidden_size * (grad_bytes + (2 if autocast else 0))
        if shape.tie_embeddings:
            # lm_head's gradient lands in .grad first; embedding backward then builds a second dense
            # (vocab x hidden) gradient and AccumulateGrad adds it out of place: two extra copies live at the
            # end of backward (seen in real CPU steps under the storage tracker, llama-3.2-1b / qwen3-0.6b)
            tied = 2 * shape.vocab_size * shape.hidden_size * grad_bytes
        if job.optimizer == "adafactor":
            optimizer = _adafactor_state(shape)
        else:
            optimizer = int(n * _state_bytes_per_param(job, param_bytes))
        if deepspeed and autocast:
            optimizer += 4 * n  # fp32 master weights live in the optimizer (ZeRO's K = 12 with Adam)
        if job.optimizer == "adamw":
            opt_temp = n * param_bytes  # torch._foreach_sqrt(exp_avg_sqs): one state-sized copy
        elif job.optimizer == "adafactor":
            # HF Adafactor updates one parameter at a time: `update = grad**2 + eps` and the factored
            # estimate it multiplies are two fp32 tensors of the parameter's size, the largest one counts
            opt_temp = 2 * 4 * _largest_tensor(shape)
        if job.num_gpus > 1 and job.sharding == "ddp":
            ddp = gradients  # Reducer buckets, gradient_as_bucket_view=False (DDP default)
        trainable = n
    elif job.uses_adapter:
        n_adapter = adapter_params(shape, job)
        per_param = _state_bytes_per_param(job, 4) if job.optimizer != "adafactor" else 8
        states = int(n_adapter * per_param)
        adapter_parts = [4 * n_adapter, 4 * n_adapter, states]  # fp32 weights, grads, optimizer states
        opt_temp = 4 * n_adapter if job.optimizer == "adamw" else 0
        if job.num_gpus > 1 and job.sharding == "ddp":
            ddp = 4 * n_adapter
        trainable = n_adapter

    # 3. sharding across data-parallel ranks, tensor parallel as a plain divisor
    if job.is_training and dp > 1:
        if job.sharding in ("zero1", "zero2", "zero3", "fsdp"):
            optimizer //= dp
            opt_temp //= dp
            adapter_parts[2] //= dp
        if job.sharding in ("zero2", "zero3", "fsdp"):
            gradients //= dp
            adapter_parts[1] //= dp
            # DeepSpeed/HF 'auto' reduce_bucket_size = hidden_size^2 elements (HF deepspeed integration docs)
            reduce = min(shape.hidden_size**2, trainable) * 2 if deepspeed else 0
        if job.sharding in ("zero3", "fsdp"):
            weights //= dp
            quant //= dp
            adapter_parts[0] //= dp
    gather = 0
    if job.sharding in ("zero3", "fsdp") and (dp > 1 or job.offload == "optimizer+params"):
        # one decoder layer unsharded for compute plus the next one prefetched, in the compute dtype
        layer_bytes = shape.layer_params() * (compute if job.method != "qlora" else 1)
        gather = 2 * layer_bytes // tp
        if job.sharding == "fsdp":
            # FSDP2 keeps the root unit (embedding, final norm, lm_head) unsharded after forward, so it is
            # gathered through backward (torch.distributed.fsdp.fully_shard: the root does not reshard)
            root = shape.embedding_params + shape.lm_head_params + shape.hidden_size
            gather += root * (compute if job.method != "qlora" else 2) // tp
            if job.method == "full":  # ... and its gradients are computed unsharded before the reduce-scatter
                gather += root * compute // tp
    if job.offload != "none":
        optimizer = opt_temp = (
            0  # DeepSpeed CPU Adam / FSDP CPU offload keep states (and masters) on the host
        )
    if job.offload == "optimizer+params":
        weights = quant = 0

    # 4. transient copies made in forward/backward
    autocast_copies = 0
    # DeepSpeed and FSDP compute from bf16 params they hold or gather; plain torch AMP casts under autocast.
    if autocast and job.method != "qlora" and job.sharding == "ddp":
        lm_head = shape.vocab_size * shape.hidden_size
        autocast_copies = 2 * (linear_w + lm_head)
    dequant = 0
    if job.method == "qlora":
        dequant = 2 * max(
            lin.in_features * lin.out_features for lin in shape.layer_linears() if lin.is_nn_linear
        )

    return ParameterBytes(
        weights=weights // tp,
        quant_constants=quant // tp,
        gradients=gradients // tp,
        optimizer=optimizer // tp,
        adapter=(adapter_parts[0] + adapter_parts[2]) // tp,
        adapter_grads=adapter_parts[1] // tp,
        optimizer_temporary=opt_temp // tp,
        autocast_copies=autocast_copies // tp,
        dequant_temporary=dequant // tp,
        gather_buffers=gather,
        ddp_buckets=ddp // tp,
        reduce_buckets=reduce,
        tied_grad_temporary=tied // tp,
        head_grad=head // tp,
    )
