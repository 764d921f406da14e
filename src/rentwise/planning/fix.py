"""The OOM doctor: which memory component overflows a card, and every change that would make the job fit.

Each remedy is the user's `MemoryJob` with one change (or, last, the cheapest changes combined), estimated
with the same `estimate_memory` as `rentwise memory`, and timed with the planner's model (planning/time.py)
so the list can say what each fix costs in speed: gradient checkpointing recomputes a forward pass (+1/3
FLOPs for full fine-tuning), QLoRA dequantises weights (0.74× LoRA's speed, Qwen's measurement), offload
moves gradients and weights over PCIe every step, more cards add communication. A smaller micro-batch with
more accumulation keeps the global batch, and this model gives it the same speed (it leaves out the lower
utilisation of small matmuls). Remedies that fit come first, fastest first.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from rentwise.errors import ConfigError
from rentwise.hardware.catalog import GpuSpec
from rentwise.memory.breakdown import MemoryBreakdown
from rentwise.memory.job import MemoryJob
from rentwise.models.shape import ModelShape
from rentwise.planning.job import JobSpec
from rentwise.planning.offers import Currency, Offer
from rentwise.planning.planner import Candidate, Estimator, Strategy, step_time, trainable_params
from rentwise.planning.time import METHOD_FACTOR, default_utilisation, matmul_params, training_flops_per_token

MORE_CARDS = (2, 4, 8)


@dataclass(frozen=True)
class Remedy:
    """One change to the job and what it gives and costs."""

    change: str
    gpu: str
    num_gpus: int
    peak_bytes: int
    capacity_bytes: int
    tokens_per_s: float | None
    """Training throughput on `num_gpus` × `gpu`; None when the card's peak is unknown."""
    relative_time: float | None
    """Time per token relative to the original job on the user's card (1.0 = same speed)."""
    cost_per_mtok: float | None
    """Cheapest on-demand price of this machine shape per million tokens; None without a price."""
    job: MemoryJob

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    @property
    def saved_bytes(self) -> int:
        return self.capacity_bytes - self.peak_bytes


@dataclass(frozen=True)
class Diagnosis:
    """The job on the user's card: the breakdown, the overflow, and the ranked remedies."""

    model: str
    gpu: str
    capacity_bytes: int
    breakdown: MemoryBreakdown
    largest: tuple[tuple[str, int], ...]
    """Components by size, largest first (label, bytes)."""
    remedies: tuple[Remedy, ...]
    currency: str

    @property
    def over_bytes(self) -> int:
        return self.breakdown.total_bytes - self.capacity_bytes

    @property
    def overflowing(self) -> tuple[str, ...]:
        """The fewest largest components that on their own exceed the card (empty when the job fits)."""
        if self.over_bytes <= 0:
            return ()
        total, names = 0, list[str]()
        for label, size in self.largest:
            total, names = total + size, [*names, label]
            if total > self.capacity_bytes:
                break
        return tuple(names)


def _timing(shape: ModelShape, job: MemoryJob, gpu: GpuSpec, interconnect: str = "") -> float | None:
    """Tokens per second of `job` on `job.num_gpus` × `gpu`, or None when the card has no known peak."""
    spec = JobSpec(model=shape.name, method=job.method if job.method != "inference" else "full", tokens=1,
                   seq_len=job.seq_len, global_batch=job.micro_batch * job.num_gpus)  # fmt: skip
    candidate = Candidate(
        strategy=_strategy(job), peak_bytes=0, trainable_params=trainable_params(shape, job)
    )
    timed = step_time(shape, spec, candidate, gpu, job.num_gpus, interconnect,
                      default_utilisation(gpu, job.method))  # fmt: skip
    if timed is None:
        return None
    step, tokens = timed
    return tokens / step.total_s if math.isfinite(step.total_s) else None


def _strategy(job: MemoryJob) -> Strategy:
    return Strategy(job.method, job.micro_batch, 1, job.grad_checkpointing, job.sharding, job.offload,
                    job.precision)  # fmt: skip


def _compute_ratio(shape: ModelShape, old: MemoryJob, new: MemoryJob) -> float:
    """Time per token of `new` over `old` on one card from FLOPs and the method factor alone (for a card
    known only by its size: its peak cancels out; communication and offload are not counted)."""

    def cost(job: MemoryJob) -> float:
        flops = training_flops_per_token(matmul_params(shape), shape.num_layers, shape.q_dim, job.seq_len,
                                         job.method, job.grad_checkpointing)  # fmt: skip
        return flops.hardware / METHOD_FACTOR.get(job.method, 1.0)

    return cost(new) / cost(old)


def _cheapest_per_hour(
    offers: Sequence[Offer], gpu: GpuSpec, num_gpus: int, currency: Currency
) -> float | None:
    prices = [
        currency.convert(o.on_demand_per_hour, o.currency) * num_gpus / o.gpu_count
        for o in offers
        if o.gpu == gpu.name and o.on_demand_per_hour is not None
    ]
    return min(prices, default=None)


def _variants(job: MemoryJob) -> list[tuple[str, MemoryJob]]:
    """Single changes that can lower peak memory, each as (description, new job)."""
    out: list[tuple[str, MemoryJob]] = []

    def add(text: str, **changes: object) -> None:
        # An invalid combination for this job (MemoryJob raises ConfigError) is simply not a remedy.
        with contextlib.suppress(ConfigError):
            out.append((text, replace(job, **changes)))  # type: ignore[arg-type]

    if job.is_training and not job.grad_checkpointing:
        add("gradient checkpointing (--grad-ckpt)", grad_checkpointing=True)
    if job.precision == "fp32":
        add("bf16 mixed precision (--precision amp_bf16)", precision="amp_bf16")
    if job.precision.startswith("amp") and job.method != "full":
        add("bf16 base weights (--precision bf16)", precision="bf16")
    micro = job.micro_batch // 2
    while micro >= 1:
        accum = job.micro_batch // micro
        add(f"micro-batch {micro} with {accum}× more accumulation (--batch {micro})", micro_batch=micro)
        micro //= 2
    if job.method == "full" and job.optimizer in ("adamw", "adamw_fused"):
        add("8-bit AdamW (--optimizer adamw_8bit)", optimizer="adamw_8bit")
    if job.method == "full":
        add("LoRA instead of full fine-tuning (--method lora)", method="lora", precision="bf16")
    if job.method in ("full", "lora"):
        add("QLoRA: 4-bit base (--method qlora)", method="qlora", precision="bf16")
    if job.method == "full" and job.offload == "none":
        add("ZeRO-2 optimizer offload to CPU (--sharding zero2 --offload optimizer)", sharding="zero2",
            offload="optimizer")  # fmt: skip
        add("ZeRO-3 optimizer and parameter offload (--sharding zero3 --offload optimizer+params)",
            sharding="zero3", offload="optimizer+params")  # fmt: skip
    return out


def diagnose(
    shape: ModelShape,
    job: MemoryJob,
    gpu: GpuSpec,
    gpus: Sequence[GpuSpec],
    offers: Sequence[Offer] = (),
    currency: Currency | None = None,
    estimate: Estimator | None = None,
) -> Diagnosis:
    """Explain what overflows `gpu` and rank every remedy (fits first, then fastest, then most headroom)."""
    if estimate is None:
        from rentwise.memory.estimate import estimate_memory

        estimate = estimate_memory
    currency = currency or Currency()
    breakdown = estimate(shape, job)
    base_speed = _timing(shape, job, gpu)
    capacity = gpu.usable_bytes

    def remedy(change: str, new_job: MemoryJob, card: GpuSpec, peak: int | None = None) -> Remedy:
        peak = estimate(shape, new_job).total_bytes if peak is None else peak
        speed = _timing(shape, new_job, card)
        relative = base_speed / speed if (speed and base_speed) else None
        if (
            relative is None
            and card is gpu
            and new_job.num_gpus == job.num_gpus
            and new_job.offload == "none"
        ):
            relative = _compute_ratio(shape, job, new_job)  # same card: peak cancels, FLOPs decide
        price = _cheapest_per_hour(offers, card, new_job.num_gpus, currency)
        per_mtok = price / (speed * 3600) * 1e6 if (price is not None and speed) else None
        return Remedy(change, card.name, new_job.num_gpus, peak, card.usable_bytes, speed, relative, per_mtok,
                      new_job)  # fmt: skip

    remedies = [remedy(text, new_job, gpu) for text, new_job in _variants(job)]
    remedies += _combined(shape, job, gpu, remedies, estimate, remedy)
    remedies += _bigger_cards(job, breakdown.total_bytes, gpu, gpus, remedy)
    remedies += _more_cards(shape, job, gpu, estimate, remedy)
    ranked = sorted(remedies, key=lambda r: (not r.fits, r.relative_time or math.inf, r.peak_bytes))
    largest = sorted(((label, size) for _, label, size in breakdown.components() if size > 0),
                     key=lambda item: -item[1])  # fmt: skip
    return Diagnosis(shape.name, gpu.name, capacity, breakdown, tuple(largest), tuple(ranked), currency.code)


def _combined(shape: ModelShape, job: MemoryJob, gpu: GpuSpec, singles: Sequence[Remedy], estimate: Estimator,
              remedy: Callable[..., Remedy]) -> list[Remedy]:  # fmt: skip
    """When no single change fits: stack the fastest changes (checkpointing, micro-batch 1, 8-bit optimizer,
    then LoRA/QLoRA) until the job fits."""
    if any(r.fits for r in singles if r.gpu == gpu.name and r.num_gpus == job.num_gpus):
        return []
    steps = [("gradient checkpointing", {"grad_checkpointing": True}), ("micro-batch 1", {"micro_batch": 1}),
             ("8-bit AdamW", {"optimizer": "adamw_8bit"}), ("LoRA", {"method": "lora", "precision": "bf16"}),
             ("QLoRA", {"method": "qlora", "precision": "bf16"})]  # fmt: skip
    current, done = job, list[str]()
    for text, changes in steps:
        try:
            candidate = replace(current, **changes)  # type: ignore[arg-type]
        except ConfigError:
            continue
        if candidate == current:
            continue
        current, done = candidate, [*done, text]
        peak = estimate(shape, current).total_bytes
        if peak <= gpu.usable_bytes:
            return [remedy(" + ".join(done), current, gpu, peak)]
    return []


def _bigger_cards(job: MemoryJob, need_bytes: int, gpu: GpuSpec, gpus: Sequence[GpuSpec],
                  remedy: Callable[..., Remedy]) -> list[Remedy]:  # fmt: skip
    """The two smallest cards in the catalog that hold the unchanged job."""
    bigger = sorted((g for g in gpus if g.usable_bytes >= need_bytes and g.name != gpu.name),
                    key=lambda g: (g.usable_bytes, g.name))  # fmt: skip
    return [remedy(f"a bigger card: {g.name} ({g.usable_bytes / 2**30:.0f} GiB)", job, g, need_bytes)
            for g in bigger[:2]]  # fmt: skip


def _more_cards(shape: ModelShape, job: MemoryJob, gpu: GpuSpec, estimate: Estimator,
                remedy: Callable[..., Remedy]) -> list[Remedy]:  # fmt: skip
    """The fewest cards of the same model that hold the job sharded with ZeRO-3."""
    if not job.is_training or job.num_gpus > 1:
        return []
    for n in MORE_CARDS:
        try:
            sharded = replace(job, num_gpus=n, sharding="zero3")
        except ConfigError:
            return []
        peak = estimate(shape, sharded).total_bytes
        if peak <= gpu.usable_bytes:
            return [remedy(f"{n}× {gpu.name} with ZeRO-3 (--gpus {n} --sharding zero3)", sharded, gpu, peak)]
    return []


def card_from_size(nameplate_bytes: int) -> GpuSpec:
    """A card known only by its nameplate memory: usable memory by the catalog's rule for unknown cards
    (nameplate × (1 − 1/64), rentwise/hardware/catalog.py), no compute figures."""
    gib = nameplate_bytes / 2**30
    return GpuSpec(name=f"{gib:g} GiB card", vendor="", memory_gib=gib,
                   architecture="unknown", compute_capability="", supports_bf16=True, source="user input",
                   as_of="")  # fmt: skip
