"""Real-GPU check: measured memory of real training/inference steps next to analytic and trace predictions.

For a grid of random-initialised models up to 8B, each in a fresh process on the GPU, it runs the very step
the tracer fakes (rentwise.trace.step: two training steps with foreach AdamW, or prefill + decode) on real
CUDA tensors, with PyTorch choosing the attention kernel and CUDA autocast, and records:
  - torch.cuda.max_memory_allocated  (compare: breakdown.allocated_bytes)
  - torch.cuda.max_memory_reserved   (compare: breakdown.reserved_bytes, the allocator model)
  - the process's "used" memory in nvidia-smi (compare: breakdown.total_bytes = reserved + CUDA context)
  - the CUDA context itself (nvidia-smi used minus reserved right after CUDA init)
QLoRA rows use real bitsandbytes 4-bit layers when bitsandbytes is installed (else they are skipped).
Expected run time: < 8 minutes on one H100/H200-class GPU.

Results: benchmarks/results/gpu_validate.{md,json}.
Run: python benchmarks/gpu_validate.py [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
GIB = 1024**3

GRID: tuple[tuple[str, dict[str, Any]], ...] = (
    ("qwen2.5-0.5b", {"method": "full", "micro_batch": 4, "seq_len": 1024}),
    ("llama-3.2-1b", {"method": "full", "precision": "bf16", "micro_batch": 2, "seq_len": 2048,
                      "grad_checkpointing": True}),
    ("llama-3.2-1b", {"method": "lora", "micro_batch": 1, "seq_len": 1024, "attention": "eager"}),
    ("llama-3.2-1b", {"method": "inference", "precision": "bf16", "micro_batch": 8, "seq_len": 1024,
                      "generate_len": 16}),
    ("llama-3.1-8b", {"method": "lora", "precision": "bf16", "seq_len": 2048}),
    ("llama-3.1-8b", {"method": "lora", "precision": "bf16", "micro_batch": 2, "seq_len": 2048,
                      "grad_checkpointing": True, "lora_targets": ("all-linear",)}),
    ("llama-3.1-8b", {"method": "qlora", "precision": "bf16", "seq_len": 2048}),
    ("llama-3.1-8b", {"method": "inference", "precision": "bf16", "micro_batch": 4, "seq_len": 2048,
                      "generate_len": 32}),
    ("mistral-7b-v0.1", {"method": "full", "precision": "bf16", "seq_len": 1024, "grad_checkpointing": True}),
)  # fmt: skip


# --- child: one real step on the GPU ------------------------------------------------------------------------
def _process_used_bytes() -> int | None:
    """This process's GPU memory as nvidia-smi lists it (NVML's per-process used memory)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip() == str(os.getpid()):
            return int(used.strip()) * 1024**2
    return None


def _quantise_with_bitsandbytes(model: Any, compute_dtype: Any, double_quant: bool) -> None:
    """Replace every nn.Linear but the output head by a real bnb Linear4bit (NF4) quantised on the GPU."""
    import bitsandbytes as bnb
    import torch

    output = model.get_output_embeddings()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child is output:
                continue
            layer = bnb.nn.Linear4bit(
                child.in_features, child.out_features, bias=child.bias is not None,
                compute_dtype=compute_dtype, compress_statistics=double_quant, quant_type="nf4",
                device="meta",
            )  # fmt: skip
            layer.weight = bnb.nn.Params4bit(
                child.weight.data, requires_grad=False, quant_type="nf4", compress_statistics=double_quant
            ).cuda()  # quantised on the GPU: packed uint8 + absmax (+ nested constants)
            if child.bias is not None:
                layer.bias = torch.nn.Parameter(child.bias.data.to(compute_dtype), requires_grad=False)
            setattr(parent, name, layer)
            del child
        torch.cuda.empty_cache()


def _job(job_kwargs: dict[str, Any]) -> Any:
    from rentwise.memory.job import MemoryJob

    return MemoryJob(**{k: tuple(v) if isinstance(v, list) else v for k, v in job_kwargs.items()})


def measure(model_name: str, job_kwargs: dict[str, Any]) -> dict[str, Any]:
    import torch

    from rentwise.models.catalog import load_shape
    from rentwise.trace.build import BuiltModel, _apply_lora, build_model, dtypes, hf_config, materialise
    from rentwise.trace.step import run_inference, run_training_step
    from rentwise.trace.tracker import MemoryTracker, ModuleAttribution

    shape, job = load_shape(model_name), _job(job_kwargs)
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    used = _process_used_bytes()
    context = used - torch.cuda.memory_reserved() if used is not None else None
    tracker = MemoryTracker()  # never entered: only for the tagging calls the step makes
    if job.method == "qlora":
        from transformers import AutoModelForCausalLM

        param_dtype, autocast_dtype = dtypes(job)
        config = hf_config(shape, "sdpa")
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, dtype=param_dtype)
        _quantise_with_bitsandbytes(model, autocast_dtype or param_dtype, job.qlora_double_quant)
        if job.grad_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = _apply_lora(model, job)
        model.train()
        built = BuiltModel(model, "base_model.model.model", param_dtype, autocast_dtype)
    else:
        built = build_model(shape, job)
        materialise(built.model, tracker, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    if job.is_training:
        run_training_step(built, job, tracker, ModuleAttribution(tracker), device="cuda")
    else:
        run_inference(built, job, tracker, device="cuda")
    torch.cuda.synchronize()
    return {
        "max_allocated_bytes": torch.cuda.max_memory_allocated(),
        "max_reserved_bytes": torch.cuda.max_memory_reserved(),
        "smi_used_bytes": _process_used_bytes(),
        "cuda_context_bytes": context,
        "step_s": time.perf_counter() - start,
        "gpu": torch.cuda.get_device_name(),
        "compute_capability": "{}.{}".format(*torch.cuda.get_device_capability()),
        "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory,
    }


# --- parent: run the grid, predict, compare ---------------------------------------------------------------
def _predict(model_name: str, job_kwargs: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    from rentwise.memory.estimate import estimate_memory
    from rentwise.models.catalog import load_shape
    from rentwise.trace import target_from_gpu, trace_memory

    shape, job = load_shape(model_name), _job(job_kwargs)
    target = target_from_gpu(measured["gpu"], measured["compute_capability"], measured["gpu_memory_bytes"])
    analytic = estimate_memory(shape, job)
    traced = trace_memory(shape, job, target=target)
    return {
        "analytic": {k: getattr(analytic, k) for k in ("allocated_bytes", "reserved_bytes", "total_bytes")},
        "trace": {
            k: getattr(traced.breakdown, k) for k in ("allocated_bytes", "reserved_bytes", "total_bytes")
        }
        | {"allocator_max_allocated_bytes": traced.allocator_max_allocated_bytes},
        "trace_kernels": dict(traced.attention_kernels),
    }


def _err(predicted: int | None, measured: int | None) -> str:
    if not predicted or not measured:
        return "n/a"
    return f"{(predicted - measured) / measured:+.1%}"


def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.2f}"


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Real GPU memory vs analytic and trace predictions",
        "",
        "Generated by `python benchmarks/gpu_validate.py`. Measured: max_memory_allocated /",
        "max_memory_reserved after two training steps (or prefill + decode); smi = this process's used",
        "memory in nvidia-smi.",
        "Errors are (predicted - measured) / measured. trace alloc* = the allocator model's max_allocated",
        "(512-byte rounding, unsplit blocks).",
        "",
        "| model | job | GPU | measured alloc / reserved / smi GiB | analytic alloc (err) "
        "| trace alloc (err) | trace alloc* (err) | trace reserved (err) | trace smi (err) | context GiB |",
        "|---|---|---|---|---|---|---|---|---|---:|",
    ]
    for row in rows:
        m = row.get("measured")
        if not m:
            lines.append(f"| {row['model']} | {row['job']} | skipped: {row['skipped']} |||||||")
            continue
        a, t = row["analytic"], row["trace"]
        lines.append(
            f"| {row['model']} | {row['job']} | {m['gpu']} | {_gib(m['max_allocated_bytes'])} / "
            f"{_gib(m['max_reserved_bytes'])} / {_gib(m['smi_used_bytes'])} | "
            f"{_gib(a['allocated_bytes'])} ({_err(a['allocated_bytes'], m['max_allocated_bytes'])}) | "
            f"{_gib(t['allocated_bytes'])} ({_err(t['allocated_bytes'], m['max_allocated_bytes'])}) | "
            f"{_gib(t['allocator_max_allocated_bytes'])} "
            f"({_err(t['allocator_max_allocated_bytes'], m['max_allocated_bytes'])}) | "
            f"{_gib(t['reserved_bytes'])} ({_err(t['reserved_bytes'], m['max_reserved_bytes'])}) | "
            f"{_gib(t['total_bytes'])} ({_err(t['total_bytes'], m['smi_used_bytes'])}) | "
            f"{_gib(m['cuda_context_bytes'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "JOB_JSON"), help=argparse.SUPPRESS)
    parser.add_argument("--only", default="", help="run grid rows whose 'model job' contains this text")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child[0], json.loads(args.child[1]))))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_validate: no CUDA GPU here; nothing measured", file=sys.stderr)
        return 1
    rows: list[dict[str, Any]] = []
    for model, job_kwargs in GRID:
        label = " ".join(f"{k}={v}" for k, v in job_kwargs.items())
        if args.only and args.only not in f"{model} {label}":
            continue
        row: dict[str, Any] = {"model": model, "job": label}
        if job_kwargs["method"] == "qlora" and not _has_bitsandbytes():
            rows.append(row | {"skipped": "bitsandbytes not installed"})
            continue
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        child = [sys.executable, __file__, "--child", model, json.dumps(job_kwargs)]
        done = subprocess.run(child, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            rows.append(
                row | {"skipped": done.stderr.strip().splitlines()[-1][:200] if done.stderr else "failed"}
            )
            print(f"{model} {label}: FAILED\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        row |= {"measured": measured} | _predict(model, job_kwargs, measured)
        rows.append(row)
        print(
            f"{model} {label}: allocated {_gib(measured['max_allocated_bytes'])} GiB "
            f"(trace {_err(row['trace']['allocated_bytes'], measured['max_allocated_bytes'])}, "
            f"analytic {_err(row['analytic']['allocated_bytes'], measured['max_allocated_bytes'])})",
            file=sys.stderr,
            flush=True,
        )
    text = render(rows)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    suffix = "" if not args.only else "_partial"
    (RESULTS / f"gpu_validate{suffix}.md").write_text(text)
    (RESULTS / f"gpu_validate{suffix}.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _has_bitsandbytes() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


if __name__ == "__main__":
    raise SystemExit(main())
