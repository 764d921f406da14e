"""Bench results -> a verdict with reasons: healthy, throttled, likely shared or noisy, or not as advertised.

Pure: takes the measurements, the NVML samples taken during the run and the catalog row, never a GPU. Achieved
figures are compared with the catalog's dense peaks and with the fraction such a card normally reaches.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rentwise.errors import ConfigError, NotFoundError
from rentwise.hardware.catalog import GpuSpec
from rentwise.machine.readings import (
    HARDWARE_REASONS,
    REASON_SW_POWER_CAP,
    THERMAL_REASONS,
    FieldError,
    GpuFacts,
    Sample,
    from_json,
    read_text_file,
)
from rentwise.units import format_gib

Status = Literal[
    "healthy",
    "throttled",
    "likely shared or noisy",
    "slower than expected for this card (possibly not the card advertised)",
    "not the card advertised",
    "inconclusive",
]
SLOWER_THAN_EXPECTED: Status = "slower than expected for this card (possibly not the card advertised)"

# Best achievable dense BF16 matmul on NVIDIA is 77.6-86.9% of the datasheet peak (stas00/ml-engineering MAMF
# finder: B200 77.6%, H100 SXM 80.3%, A100 SXM 86.9%; shared/data README). A card under 70% is below what
# its model normally reaches; 7 points of margin under the lowest published figure. Those are best cases:
# the MAMF finder sweeps shapes for the fastest, and our default 8192³ is one such large shape. Smaller
# products (`--quick`'s 4096³) fill the GPU less well and we have no sourced figure for them, so a shortfall
# alone is never proof of a different card (see `judge`).
MATMUL_NORMAL_FRACTION = 0.70
MATMUL_REFERENCE_N = 8192
"""The smallest square size the 70% is meant for; smaller runs say so next to a shortfall."""
# Device-to-device copy (read + write counted) reaches ~90% of the datasheet bandwidth on HBM parts in public
# measurements (H100 SXM 3.02 of 3.35 TB/s; H100 PCIe 1.86 of 2.0 TB/s). 75% leaves margin for GDDR parts.
COPY_NORMAL_FRACTION = 0.75
# PCIe payload is at most ~90% of the link rate (128b/130b encoding, ~24-byte TLP headers per 256-byte
# payload: PCIe 3.0+ base spec), measured against one direction's share of the link. Under 60% points at a
# narrower or older link (x8 gives 45%).
HOST_COPY_NORMAL_FRACTION = 0.60
# The catalog's `pcie_gbps` is the x16 figure for both directions together (Gen4 x16 = 64 GB/s = 32 each way;
# `GpuSpec.pcie_gbps`), and `nvlink_gbps` is NVIDIA's per-GPU total over both directions (H100: 900 GB/s =
# 450 each way: 18 NVLink 4 links x 50 GB/s counting both directions, H100 datasheet). A copy moves data one
# way, so it is compared with half.
ONE_DIRECTION_SHARE = 0.5
# Beyond this the run beat the catalog's peak: the card is not the one the catalog row describes.
ABOVE_PEAK_FRACTION = 1.10
# A fixed GEMM on a dedicated GPU repeats within a few percent; (max - min) / median above 10% means
# something else competes for the card or its host (our threshold; `--compare` confirms it over time).
NOISY_SPREAD = 0.10
# Thermal or hardware slowdown on more than 10% of the samples taken during the run.
THROTTLED_SAMPLE_FRACTION = 0.10
# Enforced power limit 5%+ under the card's default: the provider lowered it.
LOWERED_POWER_LIMIT_FRACTION = 0.95
# Slower than an earlier run of the same card by more than this: it is not the card, it is the neighbours.
SLOWER_THAN_BEFORE = 0.10
# Before the benchmark starts our process holds no CUDA context, so an idle dedicated card reads 0-1%
# utilisation and only a few MiB used. Over 5% busy or over 1 GiB used (more than one CUDA context,
# 0.3-1.3 GiB per shared/data README) means someone else is on the card.
BASELINE_BUSY_PCT = 5.0
BASELINE_USED_BYTES = 2**30


@dataclass(frozen=True)
class Measurement:
    """One benchmark, repeated: `values` holds each repeat's figure."""

    name: str
    """matmul_bf16 | matmul_fp16 | matmul_tf32 | matmul_fp32 | device_copy | host_to_device | device_to_host |
    gpu_to_gpu"""
    unit: str
    values: tuple[float, ...]
    size: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        """(max - min) / median over the repeats."""
        return (max(self.values) - min(self.values)) / self.median if self.median else 0.0


@dataclass(frozen=True)
class BenchResult:
    """What `rentwise bench` measured on one GPU, with the NVML samples taken meanwhile."""

    gpu: GpuFacts
    measurements: tuple[Measurement, ...]
    samples: tuple[Sample, ...] = ()
    own_pids: tuple[int, ...] = ()
    started_at: str = ""
    torch_version: str = ""
    cuda_build: str = ""
    peer_link: str | None = None
    """How GPU 0 reaches GPU 1 for gpu_to_gpu ("NVLink", "same PCIe switch", ...)."""
    baseline: Sample | None = None
    """One reading taken before the benchmark touched the GPU (no CUDA context of ours yet)."""


@dataclass(frozen=True)
class Comparison:
    name: str
    achieved: float
    unit: str
    peak: float | None
    fraction: float | None
    normal_fraction: float | None
    spread: float


@dataclass(frozen=True)
class Verdict:
    status: Status
    reasons: tuple[str, ...]
    comparisons: tuple[Comparison, ...]


def reference_peak(name: str, spec: GpuSpec, peer_link: str | None) -> tuple[float | None, float | None]:
    """(catalog peak in the measurement's unit, fraction such a card normally reaches) for one measurement."""
    if name.startswith("matmul_"):
        return spec.tflops(name.removeprefix("matmul_")), MATMUL_NORMAL_FRACTION  # type: ignore[arg-type]
    if name == "device_copy":
        return spec.memory_bandwidth_gbps, COPY_NORMAL_FRACTION
    if name in ("host_to_device", "device_to_host"):
        return (spec.pcie_gbps * ONE_DIRECTION_SHARE if spec.pcie_gbps else None), HOST_COPY_NORMAL_FRACTION
    if name == "gpu_to_gpu":
        # No sourced expectation for a torch copy over NVLink or PCIe peer-to-peer yet: shown, not judged.
        both_ways = spec.nvlink_gbps if peer_link == "NVLink" else spec.pcie_gbps
        return (both_ways * ONE_DIRECTION_SHARE if both_ways else None), None
    return None, None


def compare(result: BenchResult, spec: GpuSpec | None) -> tuple[Comparison, ...]:
    """Each measurement against the catalog's peak."""
    rows = []
    for m in result.measurements:
        peak, normal = reference_peak(m.name, spec, result.peer_link) if spec else (None, None)
        fraction = m.median / peak if peak else None
        rows.append(Comparison(m.name, m.median, m.unit, peak, fraction, normal, m.spread))
    return tuple(rows)


def judge(
    result: BenchResult,
    spec: GpuSpec | None,
    default_power_limit_w: float | None = None,
    earlier: BenchResult | None = None,
    detected: GpuSpec | None = None,
) -> Verdict:
    """The verdict and every reason found.

    Precedence: a wrong identity (memory size, NVML name, faster than the peak) says "not the card
    advertised"; then throttling, then contention, which also explain any shortfall. A shortfall nothing
    explains is "slower than expected for this card (possibly not the card advertised)": an H100 PCIe sold as
    SXM reaches ~61% of the SXM peak, but so might a healthy card on a shape smaller than the best-case ones
    the 70% comes from, so a shortfall alone does not claim a different card. `spec` is the card paid for
    (`--expect`), `detected` the catalog row for the name NVML reports, when they differ.
    """
    comparisons = compare(result, spec)
    identity = _identity_reasons(result, spec, comparisons)
    if spec is not None and detected is not None and detected.name != spec.name:
        identity.insert(0, f"NVML reports '{result.gpu.name}' (catalog '{detected.name}'), not a {spec.name}")
    throttle = _throttle_reasons(result, default_power_limit_w)
    contention = _contention_reasons(result, earlier)
    shortfalls = _shortfall_reasons(result, comparisons)
    reasons = (*identity, *throttle, *contention, *shortfalls)
    status: Status
    if identity:
        status = "not the card advertised"
    elif throttle:
        status = "throttled"
    elif contention:
        status = "likely shared or noisy"
    elif shortfalls:
        status = SLOWER_THAN_EXPECTED
    elif spec is None:
        return Verdict(
            "inconclusive", ("the card is not in the catalog: no peak to compare with",), comparisons
        )
    elif not any(c.fraction is not None and c.normal_fraction is not None for c in comparisons):
        return Verdict("inconclusive", ("the catalog has no peak for what was measured",), comparisons)
    else:
        return Verdict("healthy", ("every figure reaches what such a card normally reaches",), comparisons)
    return Verdict(status, reasons, comparisons)


def _identity_reasons(
    result: BenchResult, spec: GpuSpec | None, comparisons: tuple[Comparison, ...]
) -> list[str]:
    if spec is None:
        return []
    reasons: list[str] = []
    expected = spec.usable_bytes
    if not spec.matches_memory_total(result.gpu.memory_total_bytes):
        reasons.append(
            f"{format_gib(result.gpu.memory_total_bytes)} of memory where a {spec.name} has "
            f"{format_gib(expected)} ({spec.usable_rule})"
        )
    for c in comparisons:
        if c.fraction is not None and c.fraction > ABOVE_PEAK_FRACTION:
            reasons.append(
                f"{c.name} {c.achieved:.0f} {c.unit} is {c.fraction:.0%} of the {spec.name} peak: "
                "a faster card than the catalog row"
            )
    return reasons


def _throttle_reasons(result: BenchResult, default_power_limit_w: float | None) -> list[str]:
    readings = [r for s in result.samples for r in s.gpus if r.index == result.gpu.index]
    if not readings:
        return []
    reasons: list[str] = []
    slowed = [r for r in readings if r.clock_event_reasons & (THERMAL_REASONS | HARDWARE_REASONS)]
    if len(slowed) / len(readings) > THROTTLED_SAMPLE_FRACTION:
        names = sorted({n for r in slowed for n in r.slowdown_reasons() if n != "power cap"})
        hottest = max((r.temperature_c for r in readings if r.temperature_c is not None), default=None)
        heat = f" (up to {hottest:.0f} °C)" if hottest is not None else ""
        reasons.append(f"{', '.join(names)} on {len(slowed) / len(readings):.0%} of samples{heat}")
    limits = [r.power_limit_w for r in readings if r.power_limit_w]
    capped = any(r.clock_event_reasons & REASON_SW_POWER_CAP for r in readings)
    default = default_power_limit_w or result.gpu.default_power_limit_w
    if default and limits and capped and min(limits) < LOWERED_POWER_LIMIT_FRACTION * default:
        reasons.append(f"power limit {min(limits):.0f} W, below the card's default {default:.0f} W")
    return reasons


def _contention_reasons(result: BenchResult, earlier: BenchResult | None) -> list[str]:
    reasons: list[str] = []
    for m in result.measurements:
        if len(m.values) > 1 and m.spread > NOISY_SPREAD:
            reasons.append(f"{m.name} varies {m.spread:.0%} between repeats (over 10%)")
    at_start = (
        next((r for r in result.baseline.gpus if r.index == result.gpu.index), None)
        if result.baseline
        else None
    )
    if at_start is not None and (at_start.utilization_pct or 0) > BASELINE_BUSY_PCT:
        reasons.append(f"the GPU was {at_start.utilization_pct:.0f}% busy before the benchmark started")
    if at_start is not None and at_start.memory_used_bytes > BASELINE_USED_BYTES:
        reasons.append(
            f"{format_gib(at_start.memory_used_bytes)} of GPU memory was in use before the benchmark started"
        )
    readings = [r for s in result.samples for r in s.gpus if r.index == result.gpu.index]
    others = sorted({p.pid for r in readings for p in r.processes if p.pid not in result.own_pids})
    if others:
        pids = ", ".join(str(p) for p in others[:5])
        reasons.append(f"other processes used the GPU during the run (PID {pids})")
    if earlier is not None:
        before = {m.name: m.median for m in earlier.measurements}
        for m in result.measurements:
            then = before.get(m.name)
            if then and m.median < (1 - SLOWER_THAN_BEFORE) * then:
                reasons.append(
                    f"{m.name} {m.median:.0f} {m.unit} is {1 - m.median / then:.0%} slower than the earlier "
                    f"run ({then:.0f} {m.unit}, {earlier.started_at or 'saved run'})"
                )
    return reasons


def _shortfall_reasons(result: BenchResult, comparisons: tuple[Comparison, ...]) -> list[str]:
    sizes = {m.name: m.size for m in result.measurements}
    return [
        f"{c.name} reaches {c.fraction:.0%} of the catalog peak ({c.achieved:.0f} of {c.peak:.0f} {c.unit}), "
        f"below the {c.normal_fraction:.0%} such a card normally reaches{_small_matmul_note(sizes[c.name])}"
        for c in comparisons
        if c.fraction is not None and c.normal_fraction is not None and c.fraction < c.normal_fraction
    ]


def _small_matmul_note(size: str) -> str:
    """A caveat for matmuls smaller than the large shapes the 70% comes from ("4096x4096x4096")."""
    dims = [int(d) for d in size.split("x") if d.isdigit()]
    if len(dims) != 3 or min(dims) >= MATMUL_REFERENCE_N:
        return ""
    return (
        f" on large matmuls; {size} is smaller and can fall short on a healthy card (rerun without --quick)"
    )


BENCH_FORMAT = "rentwise-bench"
BENCH_VERSION = 1


def result_document(result: BenchResult, verdict: Verdict, gpu_name: str | None) -> dict[str, Any]:
    """The JSON written by `rentwise bench --save` (and printed by --json)."""
    from rentwise.cli.render import to_jsonable

    return {
        "format": BENCH_FORMAT,
        "version": BENCH_VERSION,
        "catalog_gpu": gpu_name,
        "result": to_jsonable(result),
        "verdict": to_jsonable(verdict),
    }


def load_result(path: Path) -> BenchResult:
    """Read a saved bench result, checking every field (a hand-edited file fails here, not in the verdict).

    Raises:
        NotFoundError: no such file.
        ConfigError: not a saved rentwise bench result; the message names the field.
    """
    hint = "save one with `rentwise bench --save FILE`"
    if not path.exists():
        raise NotFoundError(f"bench result '{path}' does not exist", hint=hint)
    try:
        document = json.loads(read_text_file(path, "bench result", hint))
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not JSON ({error.msg})", hint=hint) from None
    if not isinstance(document, dict) or document.get("format") != BENCH_FORMAT:
        raise ConfigError(
            f"{path}: not a saved rentwise bench result (no '{BENCH_FORMAT}' format)", hint=hint
        )
    try:
        result = from_json(BenchResult, document.get("result"), "result")
    except FieldError as error:
        raise ConfigError(f"{path}: {error}", hint=hint) from None
    for i, m in enumerate(result.measurements):
        if not m.values:  # the median of nothing: a result needs at least one repeat per measurement
            raise ConfigError(f"{path}: field 'result.measurements[{i}].values' is empty", hint=hint)
    return result
