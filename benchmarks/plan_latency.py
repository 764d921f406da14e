"""How fast `rentwise plan` answers, and how planning time grows with the offer catalog.

1. End to end: `rentwise plan MODEL --method lora --tokens 50M` over the bundled catalog, in a fresh Python
   process each time (interpreter start + imports + planning + printing), median of N runs; also checks
   that torch was never imported.
2. Planning only (CPU time): `plan()` on catalogs of the bundled size, 1k and 10k offers (the bundled
   offers repeated with new ids and prices scaled by a deterministic factor), median of N runs, and the time
   per offer.
   Linear growth means the per-offer time stays flat.
Results go to benchmarks/results/plan_latency.{json,md}.

Run: python benchmarks/plan_latency.py [--model llama-3.1-8b] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from rentwise.models.catalog import load_shape
from rentwise.planning.job import JobSpec
from rentwise.planning.offers import Offer, bundled_offers
from rentwise.planning.planner import plan

ROOT = Path(__file__).resolve().parent
SIZES = (1_000, 10_000)
CHILD = """
import sys, time
t0 = time.perf_counter()
from rentwise.cli.main import main
code = main({args!r})
elapsed = time.perf_counter() - t0
assert "torch" not in sys.modules, "torch was imported"
print(f"\\nELAPSED {{elapsed}} CODE {{code}}", file=sys.stderr)
"""


def synthetic_catalog(base: list[Offer], size: int) -> list[Offer]:
    """`size` offers: the bundled ones repeated, each copy with its own id and prices scaled by 0.8-1.2."""
    out = []
    for i in range(size):
        offer = base[i % len(base)]
        factor = 0.8 + 0.4 * ((i * 7919) % 1000) / 1000
        prices = {f"{b}_per_hour": (p * factor if (p := offer.price_per_hour(b)) is not None else None)
                  for b in ("on_demand", "spot", "weekly", "monthly")}  # fmt: skip
        out.append(replace(offer, id=f"{offer.id}-{i}", **prices))
    return out


def end_to_end(model: str, runs: int) -> dict[str, float]:
    """Wall and CPU time of the whole command in fresh processes (includes Python start-up). CPU time
    (user + sys of the child) is what the command costs; wall time also counts waiting for a busy CPU."""
    args = ["plan", model, "--method", "lora", "--tokens", "50M"]
    walls, cpus, inside = [], [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CHILD.format(args=args)], capture_output=True, text=True,
                              check=True)  # fmt: skip
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        inside.append(float(done.stderr.rsplit("ELAPSED", 1)[1].split()[0]))
    return {
        "process_wall_s": statistics.median(walls),
        "process_cpu_s": statistics.median(cpus),
        "in_process_s": statistics.median(inside),
        "load_average_1min": os.getloadavg()[0],
    }


def planning_only(model: str, runs: int) -> list[dict[str, float]]:
    shape = load_shape(model)
    job = JobSpec(model=model, method="lora", tokens=50_000_000)
    base = bundled_offers()
    rows = []
    for size in (len(base), *SIZES):
        offers = base if size == len(base) else synthetic_catalog(base, size)
        times = []
        for _ in range(runs):
            start = time.process_time()  # CPU time: other processes on the machine do not inflate it
            plan(shape, job, offers)
            times.append(time.process_time() - start)
        median = statistics.median(times)
        rows.append({"offers": size, "plan_s": median, "us_per_offer": median / size * 1e6})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    e2e = end_to_end(args.model, args.runs)
    rows = planning_only(args.model, args.runs)
    lines = [
        f"# plan latency ({args.model}, LoRA, 50M tokens; median of {args.runs})",
        "",
        f"End to end, fresh process: {e2e['process_cpu_s'] * 1000:.0f} ms CPU, "
        f"{e2e['process_wall_s'] * 1000:.0f} ms wall (in-process imports + plan + print: "
        f"{e2e['in_process_s'] * 1000:.0f} ms wall); torch not imported.",
        f"Load average during the run: {e2e['load_average_1min']:.1f} (wall time grows with it; CPU time "
        "does not).",
        "",
        "| offers | plan() CPU ms | µs per offer |",
        "|---:|---:|---:|",
        *(f"| {r['offers']:,} | {r['plan_s'] * 1000:.1f} | {r['us_per_offer']:.1f} |" for r in rows),
    ]
    growth = rows[-1]["us_per_offer"] / rows[1]["us_per_offer"]
    lines += [
        "",
        f"Per-offer time 10k vs 1k: {growth:.2f}× (1.0 = exactly linear; < 1 = fixed costs amortised).",
    ]
    text = "\n".join(lines)
    print(text)
    out = ROOT / "results"
    out.mkdir(exist_ok=True)
    (out / "plan_latency.md").write_text(text + "\n")
    record = {"model": args.model, "end_to_end": e2e, "planning": rows, "per_offer_growth_10k_vs_1k": growth}
    (out / "plan_latency.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
