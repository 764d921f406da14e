"""Analytic estimate vs published GPU measurements (shared/data/gpu_memory_measurements.csv).

For every row the estimator can express (a decoder-only model in the bundled catalog, a known method and
layout) it predicts the quantity that was measured — max_memory_allocated, max_memory_reserved or nvidia-smi
"used" — and prints the relative error. Rows it cannot express are listed with the reason. Results go to
benchmarks/results/memory_vs_published.{json,md}.

Run: python benchmarks/memory_vs_published.py [--data PATH] [--trace]   (--trace adds the fake-tensor column)
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from rentwise.errors import RentwiseError
from rentwise.memory.breakdown import MemoryBreakdown
from rentwise.memory.estimate import estimate_memory
from rentwise.memory.job import MemoryJob
from rentwise.models.catalog import load_shape
from rentwise.units import GB, GIB, MIB

ROOT = Path(__file__).resolve().parent
DEFAULT_DATA = ROOT.parent.parent / "shared" / "data" / "gpu_memory_measurements.csv"

# Published model names -> bundled shapes with the same sizes (Yi-1.5-34B has Yi-34B's dimensions;
# Mistral-7B-v0.2 differs from v0.1 only in RoPE theta and the sliding window, not in sizes).
MODEL_MAP = {
    "meta-llama/Llama-2-7b-hf": "llama-2-7b",
    "meta-llama/Llama-2-70b-hf": "llama-2-70b",
    "01-ai/Yi-34B": "yi-1.5-34b",
    "mistralai/Mistral-7B-v0.2 (base)": "mistral-7b-v0.1",
}


@dataclass(frozen=True)
class Row:
    row_id: str
    model: str
    measured_bytes: int
    measured_what: str  # allocated | reserved | smi
    job: MemoryJob | None
    reason: str
    assumption: str


def _unit_bytes(value: float, unit: str) -> int:
    """The CSV's unit column also says how sure the unit is; 'probably GiB/MiB' is taken at its word."""
    unit = unit.lower()
    if unit.startswith("gib") or "probably gib" in unit:
        return int(value * GIB)
    if unit.startswith("mib") or "probably mib" in unit:
        return int(value * MIB)
    if unit.startswith("gb"):
        return int(value * GB)
    raise ValueError(unit)


def _what(text: str) -> str:
    text = text.lower()
    if "reserved" in text:
        return "reserved"
    if "allocated" in text or "tracemalloc" in text:
        return "allocated"
    return "smi"


def parse_row(raw: dict[str, str]) -> Row:
    """Turn one CSV row into a MemoryJob, or say why it cannot be expressed."""
    model = raw["model"].strip()
    measured = _unit_bytes(float(raw["peak_memory_value"]), raw["peak_memory_unit"])
    what = _what(raw["measured_what"])
    base = dict(row_id=raw["row_id"], model=model, measured_bytes=measured, measured_what=what)
    if model not in MODEL_MAP:
        reason = "architecture not in the catalog (encoder, enc-dec or GPTBigCode)"
        return Row(**base, job=None, reason=reason, assumption="")
    method = {"QLoRA": "qlora", "LoRA": "lora"}.get(raw["task"].strip())
    if method is None:
        return Row(**base, job=None, reason=f"task '{raw['task']}' not modelled", assumption="")
    names = raw["lora_target_modules"].split("(")[0]  # drop the "(lora_target_modules='all')" remark
    targets = tuple(t.strip() for t in names.split(",") if t.strip())
    gpus = int(raw["num_gpus"])
    sharding = "fsdp" if "FSDP" in raw["parallelism"] else "ddp"
    offload = "none"
    assumption = "lora_dropout 0.1 as stated; transformers < 4.45 logits path"
    if "CPU offload of params" in raw["parallelism"]:
        offload = "optimizer+params"  # FSDP CPUOffload(offload_params=True) moves params, grads and states
        assumption += "; FSDP CPU offload of params"
    if "sharding_strategy='ddp'" in raw["parallelism"]:
        sharding = "ddp"  # FSDP told to keep a full replica per GPU
        assumption += "; FSDP 'ddp' strategy modelled as ddp"
    if "SHARD_GRAD_OP" in raw["parallelism"].upper():
        sharding = "zero2"  # parameters stay whole; gradients and optimizer state are sharded
        assumption += "; SHARD_GRAD_OP modelled as zero2"
    job = MemoryJob(
        method=method,
        precision="bf16",
        micro_batch=int(raw["micro_batch_size"]),
        seq_len=int(raw["seq_len"].split()[0]),
        grad_checkpointing=raw["grad_checkpointing"].startswith("on"),
        lora_rank=int(raw["lora_rank"]),
        lora_targets=targets,
        lora_dropout=0.1,
        num_gpus=gpus,
        sharding=sharding,  # type: ignore[arg-type]
        offload=offload,  # type: ignore[arg-type]
        legacy_logits=True,  # fsdp_qlora ran on transformers ~4.38-4.40 (fp32 logits kept by the output)
    )
    return Row(**base, job=job, reason="", assumption=assumption)


def predicted(b: MemoryBreakdown, what: str) -> int:
    return {"allocated": b.allocated_bytes, "reserved": b.reserved_bytes, "smi": b.total_bytes}[what]


def traced(row: Row, gpu_type: str) -> int | None:
    """The fake-tensor trace's prediction of the measured quantity on the row's GPU (rentwise[trace])."""
    from rentwise.hardware.catalog import find_gpu
    from rentwise.trace import target_from_gpu, trace_memory

    assert row.job is not None
    gpu = find_gpu(gpu_type.split("(")[0].replace("24GB", "").replace("x2", "").strip())
    target = target_from_gpu(gpu.name, gpu.compute_capability, gpu.usable_bytes)
    result = trace_memory(load_shape(MODEL_MAP[row.model]), row.job, target=target)
    return predicted(result.breakdown, row.measured_what)


def _summary(errors: list[float]) -> tuple[float | None, float | None]:
    if not errors:
        return None, None
    return round(statistics.median(errors), 1), round(max(errors), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--trace", action="store_true", help="add a fake-tensor trace column (minutes)")
    args = parser.parse_args()
    raw_rows = list(csv.DictReader(args.data.open(encoding="utf-8")))
    rows = [parse_row(r) for r in raw_rows]
    gpu_types = {r["row_id"]: r["gpu_type"] for r in raw_rows}
    results, skipped = [], []
    for row in rows:
        if row.job is None:
            skipped.append({"row": row.row_id, "model": row.model, "reason": row.reason})
            continue
        try:
            b = estimate_memory(load_shape(MODEL_MAP[row.model]), row.job)
        except RentwiseError as error:
            skipped.append({"row": row.row_id, "model": row.model, "reason": error.message})
            continue
        pred = predicted(b, row.measured_what)
        result = {
            "row": row.row_id, "model": MODEL_MAP[row.model], "method": row.job.method,
            "batch": row.job.micro_batch, "seq": row.job.seq_len, "measured_what": row.measured_what,
            "measured_gib": round(row.measured_bytes / GIB, 2), "analytic_gib": round(pred / GIB, 2),
            "error_pct": round(100 * (pred - row.measured_bytes) / row.measured_bytes, 1),
            "assumption": row.assumption,
        }  # fmt: skip
        if args.trace:
            trace_pred = traced(row, gpu_types[row.row_id])
            if trace_pred is not None:
                result["trace_gib"] = round(trace_pred / GIB, 2)
                result["trace_error_pct"] = round(
                    100 * (trace_pred - row.measured_bytes) / row.measured_bytes, 1
                )
            print(f"row {row.row_id}: traced", flush=True)
        results.append(result)
    median, worst = _summary([abs(r["error_pct"]) for r in results])
    summary: dict[str, object] = {
        "rows_expressed": len(results),
        "rows_skipped": len(skipped),
        "median_abs_error_pct": median,
        "max_abs_error_pct": worst,
    }
    header = "| row | model | method | batch | seq | measured | measured GiB | analytic GiB | error |"
    rule = "|---|---|---|---|---|---|---|---|---|"
    if args.trace:
        header += " trace GiB | trace error |"
        rule += "---|---|"
        t_median, t_worst = _summary([abs(r["trace_error_pct"]) for r in results if "trace_error_pct" in r])
        summary.update(trace_median_abs_error_pct=t_median, trace_max_abs_error_pct=t_worst)
    lines = [header, rule]
    for r in results:
        line = (
            f"| {r['row']} | {r['model']} | {r['method']} | {r['batch']} | {r['seq']} | {r['measured_what']} "
            f"| {r['measured_gib']} | {r['analytic_gib']} | {r['error_pct']:+.1f}% |"
        )
        if "trace_gib" in r:
            line += f" {r['trace_gib']} | {r['trace_error_pct']:+.1f}% |"
        lines.append(line)
    lines.append("")
    trace_note = ""
    if args.trace:
        trace_note = (
            f"; trace: median {summary['trace_median_abs_error_pct']}%, "
            f"max {summary['trace_max_abs_error_pct']}%"
        )
    lines.append(
        f"analytic: median |error| {median}%, max {worst}% over {len(results)} rows{trace_note}. "
        f"{len(skipped)} rows not expressible:"
    )
    lines += [f"- row {s['row']} ({s['model']}): {s['reason']}" for s in skipped]
    table = "\n".join(lines)
    print(table)
    out = ROOT / "results"
    out.mkdir(exist_ok=True)
    (out / "memory_vs_published.json").write_text(
        json.dumps({"summary": summary, "rows": results, "skipped": skipped}, indent=2) + "\n"
    )
    (out / "memory_vs_published.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
