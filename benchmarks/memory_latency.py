"""Wall time of `rentwise memory` (no torch) against the bare interpreter, in one run.

Prints a table and writes benchmarks/results/memory_latency.json. The bar (PRODUCT.md): < 100 ms.
Run: python benchmarks/memory_latency.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = {
    "python -c pass (baseline)": [sys.executable, "-c", "pass"],
    "rentwise memory qwen2.5-7b lora": [
        sys.executable, "-m", "rentwise.cli.main", "memory", "qwen2.5-7b", "--method", "lora",
        "--seq", "2048", "--batch", "1", "--grad-ckpt",
    ],
    "rentwise memory llama-3.1-70b full --json": [
        sys.executable, "-m", "rentwise.cli.main", "memory", "llama-3.1-70b", "--method", "full", "--json",
    ],
}  # fmt: skip


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    rows = {}
    for label, cmd in COMMANDS.items():
        timed(cmd)  # warm the file cache
        samples = [timed(cmd) for _ in range(args.runs)]
        rows[label] = {"median_ms": round(1000 * statistics.median(samples), 1),
                       "min_ms": round(1000 * min(samples), 1)}  # fmt: skip
    base = rows["python -c pass (baseline)"]["median_ms"]
    print(f"{'command':45s} {'median ms':>10s} {'min ms':>8s} {'x baseline':>10s}")
    for label, row in rows.items():
        print(f"{label:45s} {row['median_ms']:10.1f} {row['min_ms']:8.1f} {row['median_ms'] / base:10.1f}")
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "memory_latency.json").write_text(json.dumps({"runs": args.runs, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
