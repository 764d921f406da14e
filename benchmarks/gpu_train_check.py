"""Real-GPU check of `rentwise train` (< 8 minutes on one GPU): LoRA and QLoRA on a random-init ~1B model.

For each method it trains the bundled `llama-3.2-1b` shape (1.24B parameters, random init, byte tokenizer,
packed 512-token blocks, micro-batch 4) for 300 steps, sends SIGTERM near step 150, checks exit code 75 and
the checkpoint, reruns the same command to resume, and then prints: the loss at a few steps, the resume
result, signal-to-exit time, and the measured peak (`torch.cuda.max_memory_allocated`, logged each step by
the runner) next to `rentwise memory`'s predicted allocated peak for the same job.

Run on a CUDA machine: python benchmarks/gpu_train_check.py [--steps 300]
Writes benchmarks/results/gpu_train_check.{json,md}. QLoRA is skipped (and says so) without bitsandbytes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

RESULTS = Path(__file__).resolve().parent / "results"
MODEL, MICRO, SEQ, RANK = "llama-3.2-1b", 4, 512, 8
RENTWISE = str(Path(sys.executable).with_name("rentwise"))


def write_run(root: Path, method: str, steps: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with open(
        root / "data.jsonl", "w"
    ) as handle:  # ~460 KB of text: 900 packed blocks, wraps after 225 steps
        for i in range(1200):
            words = " ".join(f"w{(i * 31 + j * 17) % 5003}" for j in range(64))
            handle.write(json.dumps({"text": f"document {i}: {words}"}) + "\n")
    config = {
        "model": {"source": MODEL},
        "tokenizer": "bytes",
        "data": {"path": "data.jsonl", "max_length": SEQ, "packing": True},
        "method": {"kind": method, "lora_r": RANK, "lora_alpha": 16, "target_modules": "all-linear"},
        "precision": "bf16",
        "micro_batch": MICRO,
        "grad_accum": 1,
        "max_steps": steps,
        "lr": 2e-4,
        "warmup_steps": 10,
        "output_dir": "out",
        "checkpoint": {"every_steps": 100, "keep": 2},
        "price_per_hour": 3.5,
    }
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def metrics(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):  # a line cut off by the kill
            rows.append(json.loads(line))
    return rows


def steps_done(out: Path) -> int:
    return max((row["step"] for row in metrics(out) if "loss" in row), default=0)


def predicted(method: str) -> dict[str, int]:
    precision = "amp_bf16" if method == "lora" else "bf16"  # lora: fp32 base + autocast; qlora: nf4 base
    command = [
        RENTWISE, "memory", MODEL, "--method", method, "--precision", precision, "--batch", str(MICRO),
        "--seq", str(SEQ), "--lora-rank", str(RANK), "--lora-targets", "all-linear", "--json",
    ]  # fmt: skip
    report = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    return {"allocated_bytes": report["allocated_bytes"], "reserved_bytes": report["reserved_bytes"]}


def check(method: str, steps: int, work: Path) -> dict[str, Any]:
    root = work / method
    shutil.rmtree(root, ignore_errors=True)
    config, out = write_run(root, method, steps), root / "out"
    command = [RENTWISE, "train", str(config), "--no-progress"]
    started = time.monotonic()
    first = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    while steps_done(out) < steps // 2:
        if first.poll() is not None:
            raise RuntimeError(f"{method}: training ended before the signal:\n{first.stderr.read()[-3000:]}")  # type: ignore[union-attr]
        time.sleep(0.05)
    sent = time.monotonic()
    first.send_signal(signal.SIGTERM)
    _, first_err = first.communicate(timeout=300)
    exit_wall_s = time.monotonic() - sent
    preempted = [row for row in metrics(out) if row.get("event") == "preempted"]
    second = subprocess.run(command, capture_output=True, text=True, timeout=900)
    rows = metrics(out)
    losses = {row["step"]: row["loss"] for row in rows if "loss" in row}
    peak = max(row["peak_gpu_mem_bytes"] or 0 for row in rows if "loss" in row)
    expected = predicted(method)
    return {
        "method": method,
        "first_exit_code": first.returncode,
        "first_stderr_tail": first_err.strip().splitlines()[-2:],
        "stopped_at_step": preempted[-1]["step"] if preempted else None,
        "signal_to_exit_runner_s": preempted[-1]["signal_to_exit_s"] if preempted else None,
        "signal_to_exit_wall_s": exit_wall_s,
        "resume_exit_code": second.returncode,
        "resume_stderr_tail": second.stderr.strip().splitlines()[-3:],
        "final_step": max(losses, default=0),
        "loss_at": {step: losses[step] for step in sorted(losses) if step in (1, 50, steps // 2, steps)},
        "measured_peak_allocated_bytes": peak,
        "predicted_allocated_bytes": expected["allocated_bytes"],
        "predicted_reserved_bytes": expected["reserved_bytes"],
        "prediction_error_pct": 100 * (expected["allocated_bytes"] / peak - 1) if peak else None,
        "checkpoint_saves": [
            {"step": row["step"], "save_s": row["save_s"], "bytes": row["bytes"]}
            for row in rows
            if row.get("event") == "checkpoint"
        ],
        "wall_s": time.monotonic() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--work", type=Path, default=Path("gpu_train_check_runs"))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_train_check needs a CUDA GPU")
    methods = ["lora"] + (["qlora"] if importlib.util.find_spec("bitsandbytes") else [])
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "runs": []}
    if "qlora" not in methods:
        results["qlora_skipped"] = "bitsandbytes is not installed (pip install bitsandbytes)"
    for method in methods:
        results["runs"].append(check(method, args.steps, args.work))
        print(json.dumps(results["runs"][-1], indent=1), flush=True)
    lines = [
        f"# rentwise train on {results['gpu']}",
        "",
        "Command: `python benchmarks/gpu_train_check.py`",
        "",
        "| method | SIGTERM exit | stopped at | signal→exit | resumed to | loss 1 → end | peak measured | "
        "`rentwise memory` | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        loss = run["loss_at"]
        lines.append(
            f"| {run['method']} | {run['first_exit_code']} | {run['stopped_at_step']} | "
            f"{run['signal_to_exit_wall_s']:.1f} s | {run['final_step']} (exit {run['resume_exit_code']}) | "
            f"{loss.get(1, float('nan')):.3f} → {loss.get(args.steps, float('nan')):.3f} | "
            f"{run['measured_peak_allocated_bytes'] / 2**30:.2f} GiB | "
            f"{run['predicted_allocated_bytes'] / 2**30:.2f} GiB | {run['prediction_error_pct']:+.1f}% |"
        )
    if "qlora_skipped" in results:
        lines.append(f"\nQLoRA skipped: {results['qlora_skipped']}")
    print("\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gpu_train_check.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "gpu_train_check.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
