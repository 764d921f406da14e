"""Analytic estimate vs fake-tensor trace over a grid of configurations (issue 3's accuracy bar).

For each configuration it runs `estimate_memory` (analytic, microseconds) and `trace_memory` (one real HF
training/inference step on fake tensors, H100 target: flash/efficient sdpa, cuBLAS workspaces) and compares
the allocated peak (what torch.cuda.max_memory_allocated would show). Per config it prints the relative error
of the analytic figure and the components that differ most (bytes and which breakdown field), so the
analytic formulas can be fixed where they miss. Target: median <= 3%, max <= 8%.

Results: benchmarks/results/analytic_vs_trace.{md,json}.
Run: python benchmarks/analytic_vs_trace.py [--quick] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rentwise.memory.breakdown import COMPONENT_LABELS, MemoryBreakdown
from rentwise.memory.estimate import estimate_memory
from rentwise.memory.job import MemoryJob
from rentwise.models.catalog import load_shape
from rentwise.trace import TraceTarget, trace_memory

RESULTS = Path(__file__).resolve().parent / "results"
GIB = 1024**3

# Architectures: GQA + tied embeddings (llama-3.2-1b), biased QKV + tied (qwen2.5-0.5b), QK-norm (qwen3-0.6b),
# GQA untied 7B (mistral-7b-v0.1), MoE (mixtral-8x7b).
MODELS = ("llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b", "mistral-7b-v0.1", "mixtral-8x7b")

RECIPES: tuple[tuple[str, MemoryJob], ...] = (
    ("full amp_bf16 adamw b1 s1024", MemoryJob(method="full", micro_batch=1, seq_len=1024)),
    ("full bf16 adamw b2 s512 ckpt", MemoryJob(method="full", precision="bf16", micro_batch=2, seq_len=512,
                                               grad_checkpointing=True)),
    ("full amp_bf16 adafactor b1 s512", MemoryJob(method="full", optimizer="adafactor", seq_len=512)),
    ("full fp32 sgd_momentum b1 s256", MemoryJob(method="full", precision="fp32", optimizer="sgd_momentum",
                                                 seq_len=256)),
    ("lora amp_bf16 q,v r16 b1 s2048", MemoryJob(method="lora", seq_len=2048)),
    ("lora bf16 all-linear r16 b4 s1024 ckpt", MemoryJob(method="lora", precision="bf16", micro_batch=4,
                                                         seq_len=1024, grad_checkpointing=True,
                                                         lora_targets=("all-linear",))),
    ("qlora bf16 all-linear r64 b1 s2048", MemoryJob(method="qlora", precision="bf16", seq_len=2048,
                                                     lora_rank=64, lora_targets=("all-linear",))),
    ("qlora bf16 q,v b2 s1024 ckpt 8bit", MemoryJob(method="qlora", precision="bf16", micro_batch=2,
                                                    seq_len=1024, grad_checkpointing=True,
                                                    optimizer="adamw_8bit")),
    ("inference bf16 b8 ctx1024 gen16", MemoryJob(method="inference", precision="bf16", micro_batch=8,
                                                  seq_len=1024, generate_len=16)),
)  # fmt: skip


# Multi-GPU rows: per-rank memory, traced with FSDP2 over a fake process group.
SHARDED: tuple[tuple[str, str, MemoryJob], ...] = (
    ("mistral-7b-v0.1", "full bf16 fsdp x8 b1 s2048 ckpt", MemoryJob(method="full", precision="bf16",
                                                                   num_gpus=8, sharding="fsdp",
                                                                   grad_checkpointing=True)),
    ("mistral-7b-v0.1", "lora bf16 fsdp x4 b2 s2048", MemoryJob(method="lora", precision="bf16",
                                                              micro_batch=2, num_gpus=4, sharding="fsdp")),
    ("llama-3.2-1b", "full amp_bf16 zero3 x2 b1 s1024", MemoryJob(method="full", num_gpus=2, sharding="zero3",
                                                                seq_len=1024)),
)  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    model: str
    recipe: str
    analytic: MemoryBreakdown
    trace: MemoryBreakdown
    trace_s: float

    @property
    def relative_error(self) -> float:
        return (self.analytic.allocated_bytes - self.trace.allocated_bytes) / self.trace.allocated_bytes

    def component_diffs(self) -> list[tuple[str, int]]:
        """(field, analytic - trace bytes), largest absolute difference first; allocated components only."""
        fields = [f for f in COMPONENT_LABELS if f not in ("allocator_slack_bytes", "cuda_context_bytes")]
        diffs = [(f, int(getattr(self.analytic, f)) - int(getattr(self.trace, f))) for f in fields]
        return sorted((d for d in diffs if d[1]), key=lambda d: -abs(d[1]))


def compare(model: str, recipe: str, job: MemoryJob, target: TraceTarget) -> Comparison:
    shape = load_shape(model)
    start = time.perf_counter()
    traced = trace_memory(shape, job, target=target)
    return Comparison(
        model, recipe, estimate_memory(shape, job), traced.breakdown, time.perf_counter() - start
    )


def _gib(value: int) -> str:
    return f"{value / GIB:.3f}"


def _diff_text(diffs: list[tuple[str, int]], limit: int = 3) -> str:
    return "; ".join(f"{COMPONENT_LABELS[f]} {d / GIB:+.3f}" for f, d in diffs[:limit])


def render(rows: list[Comparison]) -> str:
    errors = [abs(r.relative_error) for r in rows]
    lines = [
        "# Analytic estimate vs fake-tensor trace (allocated peak, H100 target)",
        "",
        "Generated by `python benchmarks/analytic_vs_trace.py`. Error = (analytic - trace) / trace of the",
        "allocated peak (max_memory_allocated: tensors + cuBLAS workspace). Component differences are",
        "analytic - trace in GiB at each one's own peak phase.",
        "",
        f"**{len(rows)} configurations; median |error| {statistics.median(errors):.1%}, "
        f"max |error| {max(errors):.1%}** (target: median <= 3%, max <= 8%)",
        "",
        "| model | recipe | analytic GiB | trace GiB | error | peak phase (analytic / trace) "
        "| largest component differences (GiB) | trace s |",
        "|---|---|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.recipe} | {_gib(r.analytic.allocated_bytes)} "
            f"| {_gib(r.trace.allocated_bytes)} | "
            f"{r.relative_error:+.1%} | {r.analytic.peak_phase} / {r.trace.peak_phase} | "
            f"{_diff_text(r.component_diffs())} | {r.trace_s:.1f} |"
        )
    return "\n".join(lines) + "\n"


def to_json(rows: list[Comparison]) -> list[dict[str, object]]:
    def components(b: MemoryBreakdown) -> dict[str, int]:
        return {f: int(getattr(b, f)) for f in COMPONENT_LABELS} | {"allocated_bytes": b.allocated_bytes}

    return [
        {
            "model": r.model,
            "recipe": r.recipe,
            "relative_error": r.relative_error,
            "analytic": components(r.analytic) | {"peak_phase": r.analytic.peak_phase},
            "trace": components(r.trace) | {"peak_phase": r.trace.peak_phase},
            "trace_phase_peaks": dict(r.trace.phase_peaks),
            "analytic_phase_peaks": dict(r.analytic.phase_peaks),
            "trace_s": r.trace_s,
        }
        for r in rows
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first two models only")
    parser.add_argument("--only", default="", help="run configs whose 'model recipe' contains this text")
    parser.add_argument(
        "--no-write", action="store_true", help="print only; do not update benchmarks/results"
    )
    args = parser.parse_args(argv)
    models = MODELS[:2] if args.quick else MODELS
    target = TraceTarget()
    rows: list[Comparison] = []
    for model in models:
        for recipe, job in RECIPES:
            if args.only and args.only not in f"{model} {recipe}":
                continue
            row = compare(model, recipe, job, target)
            rows.append(row)
            print(
                f"{model:18s} {recipe:40s} analytic {_gib(row.analytic.allocated_bytes):>8s} "
                f"trace {_gib(row.trace.allocated_bytes):>8s} GiB  {row.relative_error:+6.1%}  "
                f"{_diff_text(row.component_diffs(), 2)}",
                file=sys.stderr,
                flush=True,
            )
    for model, recipe, job in SHARDED:
        if args.quick or (args.only and args.only not in f"{model} {recipe}"):
            continue
        row = compare(model, recipe, job, target)
        rows.append(row)
        print(f"{model:18s} {recipe:40s} {row.relative_error:+6.1%}", file=sys.stderr, flush=True)
    text = render(rows)
    print(text)
    if not args.no_write and not args.only and not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "analytic_vs_trace.md").write_text(text)
        (RESULTS / "analytic_vs_trace.json").write_text(json.dumps(to_json(rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
