"""How long training takes: FLOPs per token, the share of peak a GPU reaches (utilisation), and communication.

Formulas (each function cites its own):
- Model FLOPs per token: 6·N for full training (Kaplan et al. 2020, "Scaling Laws", §2.1) plus the attention
  term 12·L·d·T (PaLM, Chowdhery et al. 2022, App. B; llm-foundry's MFU uses the same 3 × 4·L·d·T²/T).
  LoRA/QLoRA skip the weight-gradient GEMMs of frozen weights: ≈ 4·N + 12·L·d·T (shared/data/README.md).
  N counts the weights that do a matmul per token (`matmul_params`): active parameters for MoE, minus the
  input-embedding lookup, plus the output head once (tied heads are not in the parameter count).
- Activation recomputation (gradient checkpointing) adds one forward pass: 2·N + 4·L·d·T hardware FLOPs
  (×4/3 for full training; llm-foundry's HFU definition).
- Time = hardware FLOPs / (GPUs × dense peak × utilisation). Utilisation here is the share of dense peak
  reached on *hardware* FLOPs (llm-foundry's HFU), so recomputation costs its real extra time.
- Data-parallel communication per optimizer step from ring collectives: all-reduce moves 2·(n−1)/n of the
  gradient bytes per GPU (Patarasuk & Yuan 2009; NCCL's "bus bandwidth" docs), ZeRO-3/FSDP adds two
  parameter all-gathers (Rajbhandari et al. 2020, ZeRO §7: 1.5× DDP volume). What repeats per micro-batch
  under gradient accumulation is in `data_parallel_bytes_per_step`.
Leaves out: communication/compute overlap (assumed none: pessimistic), NCCL efficiency below link peak
(optimistic), CPU-Adam compute time under offload, data-loader stalls, and kernel-level differences
between frameworks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rentwise.hardware.catalog import GpuSpec
from rentwise.models.shape import ModelShape

# --- utilisation defaults --------------------------------------------------------------------------------
# Share of dense bf16 peak reached on hardware FLOPs for full fine-tuning, by GPU family. Sources:
#   Hopper 0.40: llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16 rows without activation
#     checkpointing span 31.8–46.4% HFU (8–64 GPUs, MPT 760M–13B, FSDP); 0.40 sits in that range and is
#     the low end of the 40–46% quoted in shared/data/README.md.
#   Ampere 0.51: the same README, A100 80GB rows: 51–64% MFU (low end; shared/data/README.md "51–64%").
#   AMD MI300X 0.26: Hopper's 0.40 scaled by the ratio of best achievable bf16 matmul to peak, 51.4% for
#     MI300X vs 80.3% for H100 (stas00/ml-engineering MAMF table, in shared/data/gpu_specs.csv notes).
#   Everything else (Ada, Blackwell, Volta, Turing, Ascend): ASSUMPTION, no published training
#     utilisation in the reference data; Hopper's 0.40 is used. Override with --mfu.
UTILISATION_BY_FAMILY: dict[str, float] = {"hopper": 0.40, "ampere": 0.51, "amd": 0.26, "other": 0.40}
UTILISATION_SOURCES: dict[str, str] = {
    "hopper": "llm-foundry H100 BF16 benchmark table (32-46% HFU)",
    "ampere": "llm-foundry A100 BF16 benchmark table (51-64% MFU)",
    "amd": "Hopper 0.40 x MI300X/H100 best-matmul ratio (51.4%/80.3%, stas00 MAMF)",
    "other": "ASSUMPTION: no published figure; Hopper's 0.40 used",
}
# Method factor on top of the family figure. QLoRA dequantises the 4-bit base weights in every matmul:
# Qwen's README (QwenLM/Qwen, "Profiling of Memory and Speed", 1×A100-SXM4-80G, batch 1 × accumulation 8)
# measured Qwen-7B LoRA 5.2 s/it vs Q-LoRA 7.0 s/it at 2048 tokens (0.74) and Qwen-14B 8.4 vs 11.8 s/it
# (0.71). LoRA: ASSUMPTION 1.0 (the same GEMM kernels run; adapter matmuls are < 1% of the FLOPs).
METHOD_FACTOR: dict[str, float] = {"full": 1.0, "lora": 1.0, "qlora": 0.74}

# Ring collectives reach at most one direction of the link: vendors state NVLink and PCIe bandwidth as both
# directions together (gpus.toml: "bidirectional totals"), so the usable peak is half.
DIRECTIONS = 2


def gpu_family(gpu: GpuSpec) -> str:
    """'hopper', 'ampere', 'amd' or 'other', from the catalog's architecture text."""
    arch = gpu.architecture.lower()
    if gpu.vendor.upper() == "AMD":
        return "amd"
    if "hopper" in arch:
        return "hopper"
    if "ampere" in arch:
        return "ampere"
    return "other"


def default_utilisation(gpu: GpuSpec, method: str, learned: float | None = None) -> float:
    """Share of dense peak a fine-tune reaches on `gpu` with `method`: the per-family figure (sourced table
    above), or a `learned` full/LoRA share for this GPU, times the method factor (QLoRA's dequantisation)."""
    base = learned if learned is not None else UTILISATION_BY_FAMILY[gpu_family(gpu)]
    return base * METHOD_FACTOR.get(method, 1.0)


def peak_tflops(gpu: GpuSpec, precision: str) -> float | None:
    """Dense tensor peak used for training in `precision` (bf16 AMP, fp16 AMP, or fp32/tf32)."""
    if precision in ("amp_bf16", "bf16"):
        return gpu.bf16_tflops if gpu.supports_bf16 else None
    if precision in ("amp_fp16", "fp16"):
        return gpu.fp16_tflops
    return gpu.tf32_tflops or gpu.fp32_tflops


# --- FLOPs -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token: `model` (what MFU counts) and `hardware` (with recomputation)."""

    model: float
    hardware: float


def matmul_params(shape: ModelShape) -> int:
    """Parameters that do a matmul per token: the active ones minus the input-embedding lookup (a gather, no
    FLOPs), with the output head counted once. An untied head is already among the active parameters; a
    tied one shares the embedding's storage, so it is not, yet it still multiplies: add vocab × hidden."""
    tied_head = shape.vocab_size * shape.hidden_size if shape.tie_embeddings else 0
    return shape.num_active_params - shape.embedding_params + tied_head


def training_flops_per_token(
    params: int, num_layers: int, attn_dim: int, seq_len: int, method: str, recompute: bool
) -> FlopsPerToken:
    """FLOPs per trained token (Kaplan 6N / LoRA 4N, plus PaLM's 12·L·d·T attention term).

    `attn_dim` is heads × head_dim (the width of Q·Kᵀ and scores·V). Recomputation adds a forward pass.
    """
    attention_fwd = 4.0 * num_layers * attn_dim * seq_len
    weights_fwd = 2.0 * params
    # forward 2N; backward: input gradients 2N always, weight gradients 2N only for trained weights.
    weight_passes = 3 if method == "full" else 2
    model = weight_passes * weights_fwd + 3 * attention_fwd
    extra = (weights_fwd + attention_fwd) if recompute else 0.0
    return FlopsPerToken(model=model, hardware=model + extra)


def compute_seconds(
    tokens: float, flops_per_token: float, num_gpus: int, tflops: float, utilisation: float
) -> float:
    """Seconds to process `tokens` at `utilisation` of `num_gpus` × `tflops` dense peak."""
    return tokens * flops_per_token / (num_gpus * tflops * 1e12 * utilisation)


# --- communication ---------------------------------------------------------------------------------------
def link_gbps(gpu: GpuSpec, interconnect: str) -> float | None:
    """One-direction GPU-to-GPU bandwidth in GB/s: NVLink when the machine has it, else PCIe."""
    use_nvlink = interconnect == "nvlink" or (interconnect == "" and bool(gpu.nvlink_gbps))
    if use_nvlink and gpu.nvlink_gbps:
        return gpu.nvlink_gbps / DIRECTIONS
    if gpu.pcie_gbps:
        return gpu.pcie_gbps / DIRECTIONS
    return None


def data_parallel_bytes_per_step(
    trainable_params: int,
    total_params: int,
    num_gpus: int,
    sharding: str,
    grad_bytes: int,
    param_bytes: int,
    *,
    grad_accum: int,
) -> float:
    """Bytes each GPU sends per optimizer step of `grad_accum` micro-batches (ring collectives).

    DDP / ZeRO-1: one all-reduce of the gradients at the accumulation boundary, 2·(n−1)/n·G (DDP under
    `no_sync`; DeepSpeed's engine reduces ZeRO-0/1 gradients "only at gradient accumulation boundaries").
    ZeRO-2: gradients are partitioned, so DeepSpeed reduce-scatters them in every micro-batch's backward
    ("ZeRO stage >= 2 communicates during non gradient accumulation boundaries as well", deepspeed
    runtime/engine.py `allreduce_gradients`), (n−1)/n·G each, then all-gathers the updated weights once.
    ZeRO-3 / FSDP: every micro-batch all-gathers the parameters in forward and again in backward,
    2·(n−1)/n·P, and reduce-scatters its gradients, (n−1)/n·G (ZeRO paper §7.2.2).
    """
    if num_gpus <= 1:
        return 0.0
    share = (num_gpus - 1) / num_gpus
    gradients = trainable_params * grad_bytes
    if sharding in ("zero3", "fsdp"):
        return grad_accum * (share * gradients + 2 * share * total_params * param_bytes)
    if sharding == "zero2":
        return grad_accum * share * gradients + share * gradients
    return 2 * share * gradients


def offload_bytes_per_step(trainable_params: int, num_gpus: int, offload: str, param_bytes: int) -> float:
    """Bytes over PCIe per GPU per step for CPU offload: fp32 gradients down and updated weights back up
    (ZeRO-Offload, Ren et al. 2021, §4); parameter offload also streams the weights in for forward and
    backward. Each GPU moves its 1/n shard."""
    if offload == "none":
        return 0.0
    shard = trainable_params / max(num_gpus, 1)
    moved = shard * (4 + param_bytes)
    if offload == "optimizer+params":
        moved += 2 * shard * param_bytes
    return moved


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step, split by what takes the time."""

    compute_s: float
    communication_s: float
    offload_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.communication_s + self.offload_s


def seconds_for(n_bytes: float, gbps: float | None) -> float:
    """Seconds to move `n_bytes` at `gbps` GB/s (10⁹ bytes/s); infinite when the bandwidth is unknown."""
    if n_bytes <= 0:
        return 0.0
    if not gbps:
        return math.inf
    return n_bytes / (gbps * 1e9)
