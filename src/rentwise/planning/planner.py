"""Rank rental offers by the cost of the whole job: search strategies that fit, time them, cost them.

1. For each GPU count in the catalog, list the strategies (method, micro-batch × accumulation, gradient
   checkpointing, ZeRO stage / FSDP, CPU offload) and their peak memory per GPU, once; memory does not
   depend on which GPU model runs it.
2. For each (GPU model, count, interconnect), keep the strategies that fit the card's usable memory and pick
   the fastest (planning/time.py): shared by every offer of that machine shape.
3. For each offer and billing mode: wall time = setup + compute + evaluation + checkpoint writes + expected
   preemption loss (planning/preemption.py); cost = billed hours × price + storage + egress + snapshots
   (planning/cost.py), converted into the display currency. Check the deadline and budget.
The work per offer is a few arithmetic operations, so planning time grows linearly with the catalog.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from rentwise.errors import ConfigError, RentwiseError
from rentwise.hardware.catalog import GpuSpec, find_gpu, load_gpus
from rentwise.memory.breakdown import MemoryBreakdown
from rentwise.memory.job import MemoryJob
from rentwise.memory.parameters import adapter_params
from rentwise.models.shape import ModelShape
from rentwise.planning.cost import CostBreakdown, DataVolumes, run_cost
from rentwise.planning.job import JobSpec
from rentwise.planning.offers import BILLING_LABELS, Currency, Offer, with_currency
from rentwise.planning.preemption import DEFAULT_RESTART_S, DEFAULT_SPOT_MTBI_H, preemption_cost
from rentwise.planning.time import (
    DIRECTIONS,
    StepTime,
    compute_seconds,
    data_parallel_bytes_per_step,
    default_utilisation,
    link_gbps,
    matmul_params,
    offload_bytes_per_step,
    peak_tflops,
    seconds_for,
    training_flops_per_token,
)

Estimator = Callable[[ModelShape, MemoryJob], MemoryBreakdown]
SortKey = Literal["cost", "time", "value"]
SORT_KEYS = ("cost", "time", "value")

# Optimizer state bytes per trainable parameter that a checkpoint stores next to the fp32 weights
# (the same per-optimizer figures as rentwise/memory/parameters.py: Adam two moments, 8-bit Adam two bytes).
# Not read from `parameter_bytes`: its fields are per GPU after ZeRO sharding and offload, and its `adapter`
# field lumps LoRA weights, gradients and states together, so the checkpoint's share is not separable.
CHECKPOINT_STATE_BYTES: dict[str, float] = {
    "adamw": 8, "adamw_fused": 8, "adamw_8bit": 2, "adafactor": 0, "sgd": 0, "sgd_momentum": 4,
}  # fmt: skip

# Cards without bf16 (T4, V100) run the same recipe in fp16 (with a loss scaler).
FP16_FALLBACK = {"amp_bf16": "amp_fp16", "bf16": "fp16"}

LEAVES_OUT = (
    "communication/compute overlap (assumed none) and NCCL efficiency below link peak",
    "data-loader stalls, warm-up steps and framework differences (utilisation is a per-GPU-family constant)",
    "CPU time of the offloaded optimizer step",
    "taxes, free storage quotas and idle machine time before and after the run",
    "multi-node runs (each offer is one machine)",
)


@dataclass(frozen=True)
class Strategy:
    """How the job runs on one machine."""

    method: str
    micro_batch: int
    grad_accum: int
    grad_checkpointing: bool
    sharding: str
    offload: str
    precision: str

    def describe(self) -> str:
        """Short text such as 'lora 4×8 ckpt zero3+offload'."""
        parts = [self.method, f"{self.micro_batch}×{self.grad_accum}"]
        if self.grad_checkpointing:
            parts.append("ckpt")
        if self.sharding != "ddp":
            parts.append(self.sharding + ("" if self.offload == "none" else f"+{self.offload}-offload"))
        if self.precision in ("amp_fp16", "fp16"):
            parts.append("fp16")
        return " ".join(parts)


@dataclass(frozen=True)
class Fit:
    """The fastest strategy for one machine shape, with its memory and speed."""

    strategy: Strategy
    peak_bytes: int
    capacity_bytes: int
    step: StepTime
    tokens_per_step: int
    utilisation: float
    trainable_params: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step.total_s


@dataclass(frozen=True)
class Plan:
    """One offer under one billing mode, with its strategy, time and cost (display currency)."""

    offer: Offer
    billing: str
    gpu: str
    strategy: Strategy
    peak_bytes: int
    capacity_bytes: int
    tokens_per_s: float
    utilisation: float
    compute_h: float
    setup_h: float
    eval_h: float
    checkpoint_h: float
    lost_h: float
    expected_interruptions: float
    wall_h: float
    cost: CostBreakdown
    cost_per_mtok: float
    reasons: tuple[str, ...] = ()
    """Why the plan breaks a constraint (deadline, budget); empty when feasible."""

    @property
    def feasible(self) -> bool:
        return not self.reasons


@dataclass(frozen=True)
class Rejection:
    """An offer with no plan at all, and why."""

    offer_id: str
    label: str
    reason: str


@dataclass(frozen=True)
class PlanResult:
    """What `rentwise plan` prints: ranked feasible plans, the rest with reasons, and the assumptions."""

    model: str
    currency: str
    total_tokens: float
    sort: str
    plans: tuple[Plan, ...]
    infeasible: tuple[Plan, ...]
    rejected: tuple[Rejection, ...]
    leaves_out: tuple[str, ...] = LEAVES_OUT


# --- strategies and memory -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """A strategy for a GPU count, with its peak memory per GPU and the parameters it trains."""

    strategy: Strategy
    peak_bytes: int
    trainable_params: int


def _micro_batches(per_gpu: int, fixed: int | None) -> list[int]:
    """Micro-batches that divide the per-GPU share of the global batch exactly (powers of two, and the
    share itself), smallest first, so accumulation keeps the global batch the user asked for."""
    if fixed is not None:
        return [fixed]
    sizes = [1 << i for i in range(8) if (1 << i) <= per_gpu and per_gpu % (1 << i) == 0]
    return sizes + ([per_gpu] if per_gpu not in sizes and per_gpu <= 128 else [])


def _layouts(job: JobSpec, method: str, num_gpus: int) -> list[tuple[str, str]]:
    """(sharding, offload) pairs to try, lightest communication first."""
    if job.sharding is not None:
        shardings = [job.sharding]
    else:
        shardings = ["ddp"] if num_gpus == 1 else ["ddp", "zero2", "zero3"]
    layouts = []
    for sharding in shardings:
        offloads = [job.offload] if job.offload is not None else ["none"]
        if job.offload is None and method == "full":
            offloads += ["optimizer"] if sharding in ("zero2", "zero3", "fsdp") else []
            offloads += ["optimizer+params"] if sharding in ("zero3", "fsdp") else []
            if num_gpus == 1 and sharding == "ddp":
                layouts += [("zero2", "optimizer"), ("zero3", "optimizer+params")]
        layouts += [(sharding, offload) for offload in offloads]
    return layouts


def candidate_strategies(
    shape: ModelShape, job: JobSpec, num_gpus: int, max_capacity: int, estimate: Estimator
) -> list[Candidate]:
    """Every strategy for `num_gpus` data-parallel GPUs with its peak memory, skipping micro-batches
    that already exceed the largest card (memory grows with micro-batch)."""
    per_gpu = math.ceil(job.global_batch / num_gpus)
    checkpointing = [job.grad_checkpointing] if job.grad_checkpointing is not None else [False, True]
    found: list[Candidate] = []
    for method in job.methods_to_try():
        precision = job.precision_for(method)
        if method == "qlora" and precision == "fp32":
            precision = "bf16"  # QLoRA computes in half precision (MemoryJob rejects fp32)
        for sharding, offload in _layouts(job, method, num_gpus):
            for ckpt in checkpointing:
                for micro in _micro_batches(per_gpu, job.micro_batch):
                    memory_job = _memory_job(job, method, precision, micro, ckpt, num_gpus, sharding, offload)
                    if memory_job is None:
                        break
                    peak = estimate(shape, memory_job).total_bytes
                    if peak > max_capacity:
                        break
                    accum = math.ceil(per_gpu / micro)
                    strategy = Strategy(method, micro, accum, ckpt, sharding, offload, precision)
                    found.append(Candidate(strategy, peak, trainable_params(shape, memory_job)))
    return found


def _memory_job(job: JobSpec, method: str, precision: str, micro: int, ckpt: bool, num_gpus: int,
                sharding: str, offload: str) -> MemoryJob | None:  # fmt: skip
    try:
        return MemoryJob(
            method=method,  # type: ignore[arg-type]
            precision=precision,  # type: ignore[arg-type]
            optimizer=job.optimizer,  # type: ignore[arg-type]
            micro_batch=micro,
            seq_len=job.seq_len,
            grad_checkpointing=ckpt,
            attention=job.attention,  # type: ignore[arg-type]
            lora_rank=job.lora_rank,
            lora_targets=job.lora_targets,
            num_gpus=num_gpus,
            sharding=sharding,  # type: ignore[arg-type]
            offload=offload,  # type: ignore[arg-type]
            **dict(job.memory_extras),  # type: ignore[arg-type]
        )
    except ConfigError:
        return None  # an invalid combination (e.g. offload without ZeRO) is simply not a candidate


def trainable_params(shape: ModelShape, memory_job: MemoryJob) -> int:
    """All parameters for full fine-tuning, the adapter's for LoRA/QLoRA."""
    return shape.num_params if memory_job.method == "full" else adapter_params(shape, memory_job)


# --- speed -----------------------------------------------------------------------------------------------
def step_time(shape: ModelShape, job: JobSpec, candidate: Candidate, gpu: GpuSpec, num_gpus: int,
              interconnect: str, utilisation: float) -> tuple[StepTime, int] | None:  # fmt: skip
    """Seconds per optimizer step and tokens per step, or None when the GPU lacks the precision's peak."""
    s = candidate.strategy
    precision = s.precision
    tflops = peak_tflops(gpu, precision)
    if tflops is None and precision in ("amp_bf16", "bf16"):
        tflops = peak_tflops(gpu, "amp_fp16")  # no bf16 (T4, V100): fp16 AMP, same memory
    if tflops is None:
        return None
    flops = training_flops_per_token(matmul_params(shape), shape.num_layers, shape.q_dim, job.seq_len,
                                     s.method, s.grad_checkpointing)  # fmt: skip
    tokens = s.micro_batch * s.grad_accum * num_gpus * job.seq_len
    compute = compute_seconds(tokens, flops.hardware, num_gpus, tflops, utilisation)
    wide = precision == "fp32" or precision.startswith("amp")
    grad_bytes = 4 if wide else 2
    comm_bytes = data_parallel_bytes_per_step(
        candidate.trainable_params,
        shape.num_params,
        num_gpus,
        s.sharding,
        grad_bytes,
        2,
        grad_accum=s.grad_accum,
    )
    link = link_gbps(gpu, interconnect)
    offload_bytes = offload_bytes_per_step(candidate.trainable_params, num_gpus, s.offload, 2)
    pcie = gpu.pcie_gbps / DIRECTIONS if gpu.pcie_gbps else None  # offload is host↔GPU: PCIe, one way
    return StepTime(compute, seconds_for(comm_bytes, link), seconds_for(offload_bytes, pcie)), tokens


def fastest_fit(shape: ModelShape, job: JobSpec, candidates: Sequence[Candidate], gpu: GpuSpec,
                num_gpus: int, interconnect: str) -> Fit | str:  # fmt: skip
    """The fastest candidate that fits `gpu`, or the reason none does."""
    capacity = gpu.usable_bytes
    best: Fit | None = None
    smallest = min((c.peak_bytes for c in candidates), default=None)
    untimed = ""
    for candidate in candidates:
        if candidate.peak_bytes > capacity:
            continue
        # --mfu is taken as given; a learned per-GPU share gets the method factor like the family default.
        learned = dict(job.utilisation_by_gpu).get(gpu.name)
        utilisation = job.utilisation or default_utilisation(gpu, candidate.strategy.method, learned)
        timed = step_time(shape, job, candidate, gpu, num_gpus, interconnect, utilisation)
        if timed is None:
            untimed = f"the GPU catalog has no tensor peak for {gpu.name} in {candidate.strategy.precision}"
            continue
        step, tokens = timed
        if not math.isfinite(step.total_s):
            untimed = f"the GPU catalog has no {interconnect or 'GPU-to-GPU'} bandwidth for {gpu.name}"
            continue
        strategy = candidate.strategy
        if not gpu.supports_bf16 and strategy.precision in FP16_FALLBACK:
            # Same bytes per value, so the memory estimate holds; the plan says it runs in fp16.
            strategy = replace(strategy, precision=FP16_FALLBACK[strategy.precision])
        fit = Fit(strategy, candidate.peak_bytes, capacity, step, tokens, utilisation,
                  candidate.trainable_params)  # fmt: skip
        if best is None or (fit.tokens_per_s, fit.strategy.micro_batch) > (
            best.tokens_per_s,
            best.strategy.micro_batch,
        ):
            best = fit
    if best is not None:
        return best
    if untimed:
        return untimed
    if smallest is None or smallest > capacity:
        need = f"{smallest / 2**30:.1f} GiB" if smallest else "more than the largest card"
        return f"does not fit: needs {need} per GPU, {gpu.name} has {capacity / 2**30:.1f} GiB"
    return "no strategy fits"


# --- one offer -------------------------------------------------------------------------------------------
def checkpoint_bytes(fit: Fit, optimizer: str) -> float:
    """Bytes of one resumable checkpoint: fp32 trainable weights + optimizer states (+ frozen base: none)."""
    return fit.trainable_params * (4 + CHECKPOINT_STATE_BYTES.get(optimizer, 8))


def output_bytes(shape: ModelShape, fit: Fit) -> float:
    """Bytes downloaded at the end: bf16 weights (full) or the fp32 adapter (LoRA/QLoRA, peft's default)."""
    return shape.num_params * 2.0 if fit.strategy.method == "full" else fit.trainable_params * 4.0


def plan_offer(shape: ModelShape, job: JobSpec, offer: Offer, billing: str, fit: Fit, gpu: GpuSpec) -> Plan:
    """Time and cost of the job on `offer` (already in the display currency) under `billing`."""
    compute_s = job.total_tokens / fit.tokens_per_s
    eval_s = compute_s * job.eval_fraction
    model_bytes = shape.num_params * 2.0  # bf16 safetensors download
    setup_s = model_bytes / (job.download_gbps * 1e9) + job.upload_bytes / (job.upload_gbps * 1e9)
    ckpt_bytes = checkpoint_bytes(fit, job.optimizer)
    delta_s = ckpt_bytes / (job.disk_write_gbps * 1e9)
    if billing == "spot":
        mtbi_h = job.spot_mtbi_h or offer.spot_mtbi_h or DEFAULT_SPOT_MTBI_H
        restart = job.restart_s if job.restart_s is not None else DEFAULT_RESTART_S
        run = preemption_cost(compute_s + eval_s, delta_s, mtbi_h * 3600, restart)
    else:
        run = preemption_cost(
            compute_s + eval_s, delta_s, math.inf, 0.0, interval_s=job.checkpoint_every_h * 3600
        )
    wall_h = (setup_s + run.wall_s) / 3600
    out = output_bytes(shape, fit)
    volumes = DataVolumes(
        stored_bytes=job.upload_bytes + model_bytes + job.checkpoints_keep * ckpt_bytes,
        egress_bytes=out,
        snapshot_bytes=out,
        snapshot_months=job.snapshot_months,
    )
    cost = run_cost(offer, billing, wall_h, volumes)
    reasons = []
    if job.deadline_h is not None and wall_h > job.deadline_h:
        reasons.append(f"takes {wall_h:.1f} h, deadline {job.deadline_h:g} h")
    if job.budget is not None and cost.total > job.budget:
        reasons.append(f"costs {cost.total:,.2f} {cost.currency}, budget {job.budget:,.2f}")
    return Plan(
        offer=offer, billing=billing, gpu=gpu.name, strategy=fit.strategy, peak_bytes=fit.peak_bytes,
        capacity_bytes=fit.capacity_bytes, tokens_per_s=fit.tokens_per_s, utilisation=fit.utilisation,
        compute_h=compute_s / 3600, setup_h=setup_s / 3600, eval_h=eval_s / 3600,
        checkpoint_h=run.checkpoint_overhead_s / 3600, lost_h=run.lost_s / 3600,
        expected_interruptions=run.expected_interruptions, wall_h=wall_h, cost=cost,
        cost_per_mtok=cost.total / (job.total_tokens / 1e6), reasons=tuple(reasons),
    )  # fmt: skip


# --- the whole catalog -----------------------------------------------------------------------------------
def sort_plans(plans: Sequence[Plan], key: str) -> list[Plan]:
    """Plans ordered by total cost, wall time, or value (lowest cost × hours)."""
    if key not in SORT_KEYS:
        raise ConfigError(f"cannot sort by '{key}'", hint=f"use one of {', '.join(SORT_KEYS)}")
    keys: dict[str, Callable[[Plan], tuple[float, float]]] = {
        "cost": lambda p: (p.cost.total, p.wall_h),
        "time": lambda p: (p.wall_h, p.cost.total),
        "value": lambda p: (p.cost.total * p.wall_h, p.cost.total),
    }
    return sorted(plans, key=keys[key])


def plan(
    shape: ModelShape,
    job: JobSpec,
    offers: Sequence[Offer],
    currency: Currency | None = None,
    gpus: Sequence[GpuSpec] | None = None,
    sort: str = "cost",
    estimate: Estimator | None = None,
) -> PlanResult:
    """Plan `job` on every offer; feasible plans ranked by `sort`, the rest with their reasons."""
    if estimate is None:
        from rentwise.memory.estimate import estimate_memory

        estimate = estimate_memory
    currency = currency or Currency()
    catalog = tuple(gpus) if gpus is not None else load_gpus()
    resolved: dict[str, GpuSpec | None] = {}
    rejected: list[Rejection] = []
    usable: list[tuple[Offer, GpuSpec]] = []
    unpriced = 0
    for offer in offers:
        if offer.gpu not in resolved:
            try:
                resolved[offer.gpu] = find_gpu(offer.gpu, catalog)
            except RentwiseError:
                resolved[offer.gpu] = None
        gpu = resolved[offer.gpu]
        if gpu is None:
            rejected.append(Rejection(offer.id, offer.label, f"GPU '{offer.gpu}' is not in the GPU catalog"))
        elif job.max_gpus is not None and offer.gpu_count > job.max_gpus:
            rejected.append(
                Rejection(offer.id, offer.label, f"{offer.gpu_count} GPUs > --max-gpus {job.max_gpus}")
            )
        elif offer.gpu_count > job.global_batch:
            reason = f"{offer.gpu_count} GPUs need a global batch of at least {offer.gpu_count} sequences"
            rejected.append(Rejection(offer.id, offer.label, f"{reason} (--global-batch {job.global_batch})"))
        elif not any(offer.price_per_hour(b) is not None for b in job.billings):
            unpriced += 1  # no allowed billing mode: summarised in one line below
        else:
            usable.append((offer, gpu))

    if unpriced:
        modes = " or ".join(BILLING_LABELS[b] for b in job.billings)
        rejected.append(Rejection("", f"{unpriced} offers", f"{unpriced} offers have no {modes} price"))
    max_capacity = max((gpu.usable_bytes for _, gpu in usable), default=0)
    candidates = {n: candidate_strategies(shape, job, n, max_capacity, estimate)
                  for n in sorted({o.gpu_count for o, _ in usable})}  # fmt: skip
    fits: dict[tuple[str, int, str], Fit | str] = {}
    plans: list[Plan] = []
    for offer, gpu in usable:
        key = (gpu.name, offer.gpu_count, offer.interconnect)
        if key not in fits:
            fits[key] = fastest_fit(
                shape, job, candidates[offer.gpu_count], gpu, offer.gpu_count, offer.interconnect
            )
        fit = fits[key]
        if isinstance(fit, str):
            rejected.append(Rejection(offer.id, offer.label, fit))
            continue
        shown = with_currency(offer, currency)
        for billing in job.billings:
            if offer.price_per_hour(billing) is not None:
                plans.append(plan_offer(shape, job, shown, billing, fit, gpu))
    feasible = sort_plans([p for p in plans if p.feasible], sort)
    infeasible = sorted((p for p in plans if not p.feasible), key=lambda p: (p.cost.total, p.wall_h))
    return PlanResult(
        model=shape.name, currency=currency.code, total_tokens=job.total_tokens, sort=sort,
        plans=tuple(feasible), infeasible=tuple(infeasible), rejected=tuple(rejected),
    )  # fmt: skip


# --- recommendation --------------------------------------------------------------------------------------
def recommend(result: PlanResult) -> list[str]:
    """Plain-language lines naming the cheapest, fastest and best-value plans, and why."""
    if not result.plans:
        return []
    cheapest = min(result.plans, key=lambda p: p.cost.total)
    fastest = min(result.plans, key=lambda p: p.wall_h)
    value = min(result.plans, key=lambda p: p.cost.total * p.wall_h)
    cur = result.currency
    lines = [
        f"Cheapest: {_name(cheapest)}, {cheapest.cost.total:,.2f} {cur} in {cheapest.wall_h:.1f} h.",
        f"Fastest: {_name(fastest)}, {fastest.wall_h:.1f} h for {fastest.cost.total:,.2f} {cur}.",
        f"Best value (lowest cost × hours): {_name(value)}, {value.cost.total:,.2f} {cur} "
        f"in {value.wall_h:.1f} h.",
    ]
    if cheapest.billing == "spot":
        on_demand = [p for p in result.plans if p.billing != "spot"]
        if on_demand:
            best_od = min(on_demand, key=lambda p: p.cost.total)
            saving = 1 - cheapest.cost.total / best_od.cost.total
            lines.append(
                f"Spot is {saving:.0%} cheaper than the cheapest on-demand plan ({_name(best_od)}) even "
                f"after "
                f"{cheapest.expected_interruptions:.1f} expected preemptions; needs resumable training "
                "(`rentwise train` checkpoints and resumes)."
            )
    unknown = sorted({item for p in (cheapest, fastest, value) for item in p.cost.unknown})
    if unknown:
        lines.append(f"Not in these totals: {', '.join(unknown)} (the offers do not state those prices).")
    return lines


def _name(p: Plan) -> str:
    return f"{p.offer.label} {BILLING_LABELS[p.billing]} ({p.strategy.describe()})"


def relabel(result: PlanResult, sort: str) -> PlanResult:
    """The same result ranked by another key."""
    return replace(result, plans=tuple(sort_plans(result.plans, sort)), sort=sort)
