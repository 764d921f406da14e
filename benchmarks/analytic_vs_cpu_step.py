"""Analytic estimate vs the live-tensor peak of a real training step on CPU, on small random models.

For each architecture x setup it builds a tiny Hugging Face model from a config (no download), runs step 1
(creating the optimizer state) and then measures step 2 under a storage-counting dispatch mode (every
storage's bytes from creation to its weakref finaliser), with foreach AdamW as CUDA would pick it. The
analytic `allocated_bytes` minus its cuBLAS workspaces (which a CPU run has not) is compared with that peak.
Writes benchmarks/results/analytic_vs_cpu_step.{json,md}. Needs `rentwise[trace]`. About 2 minutes.

Run: python benchmarks/analytic_vs_cpu_step.py [--archs llama,qwen3,...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import weakref
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import AutoConfig, AutoModelForCausalLM

from rentwise.memory.estimate import estimate_memory
from rentwise.memory.job import MemoryJob
from rentwise.models.shape import shape_from_config

# Small models: 4 layers of hidden 256, vocab 3000; each entry overrides what makes its architecture.
_BASE: dict[str, Any] = dict(
    hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8, vocab_size=3000
)
ARCHS: dict[str, dict[str, Any]] = {
    "llama": {**_BASE, "model_type": "llama", "num_key_value_heads": 2},
    "qwen2-tied": {**_BASE, "model_type": "qwen2", "num_key_value_heads": 2, "tie_word_embeddings": True},
    "qwen3": {
        **_BASE,
        "model_type": "qwen3",
        "num_key_value_heads": 2,
        "head_dim": 32,
        "tie_word_embeddings": True,
    },
    "gemma2": {**_BASE, "model_type": "gemma2", "num_key_value_heads": 4, "head_dim": 32},
    "phi3": {
        **_BASE,
        "model_type": "phi3",
        "num_key_value_heads": 8,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 1,
    },
    "mixtral": {
        **_BASE,
        "model_type": "mixtral",
        "intermediate_size": 344,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "qwen3_moe": {
        **_BASE,
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 128,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
    },
}

# (method, precision, micro-batch, seq, attention, checkpointing)
SETUPS = [
    ("full", "bf16", 2, 128, "sdpa", False),
    ("full", "amp_bf16", 2, 128, "sdpa", False),
    ("full", "fp32", 2, 64, "sdpa", False),
    ("full", "bf16", 2, 128, "eager", False),
    ("full", "bf16", 2, 128, "sdpa", True),
    ("full", "bf16", 8, 256, "sdpa", False),
    ("lora", "bf16", 2, 128, "sdpa", False),
    ("lora", "bf16", 4, 128, "sdpa", True),
    ("lora", "bf16", 8, 256, "sdpa", False),
]


class LiveBytes(TorchDispatchMode):
    """Bytes of live storages: added when an op returns a new storage, removed by its weakref finaliser."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0
        self.phase = ""
        self.peak_phase = ""

    def add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.live:
            return
        self.live[key] = storage.nbytes()
        self.current += storage.nbytes()
        if self.current > self.peak:
            self.peak, self.peak_phase = self.current, self.phase
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.add(t)
        return out


def real_peak(
    config: dict[str, Any],
    method: str,
    precision: str,
    batch: int,
    seq: int,
    attention: str,
    ckpt: bool,
    targets: tuple[str, ...],
) -> tuple[int, str]:
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(**config)
    cfg._attn_implementation = attention
    model = AutoModelForCausalLM.from_config(
        cfg, dtype=torch.bfloat16 if precision == "bf16" else torch.float32
    )
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, target_modules=list(targets)))
    if ckpt:
        model.gradient_checkpointing_enable()
        if method == "lora":
            model.enable_input_require_grads()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))

    def step(mode: LiveBytes | None) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision.startswith("amp")):
            if mode:
                mode.phase = "forward"
            loss = model(input_ids=ids, labels=ids).loss
        if mode:
            mode.phase = "backward"
        loss.backward()
        if mode:
            mode.phase = "optimizer_step"
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(None)
    mode = LiveBytes()
    for tensor in [*model.parameters(), *model.buffers()]:
        mode.add(tensor)
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                mode.add(value)
    with mode:
        step(mode)
    return mode.peak, mode.peak_phase


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default=",".join(ARCHS))
    args = parser.parse_args()
    rows = []
    print(f"{'arch':10s} {'setup':34s} {'real MB':>9s} {'analytic MB':>11s} {'error':>7s}  phase")
    for arch in args.archs.split(","):
        config = ARCHS[arch]
        shape = shape_from_config(AutoConfig.for_model(**config).to_dict())
        targets = ("qkv_proj",) if arch == "phi3" else ("q_proj", "v_proj")
        for method, precision, batch, seq, attention, ckpt in SETUPS:
            attention = "eager" if arch == "gemma2" else attention  # transformers has no sdpa for Gemma 2
            real, phase = real_peak(config, method, precision, batch, seq, attention, ckpt, targets)
            job = MemoryJob(
                method=method,
                precision=precision,
                micro_batch=batch,
                seq_len=seq,  # type: ignore[arg-type]
                attention=attention,
                grad_checkpointing=ckpt,
                lora_targets=targets,
            )  # type: ignore[arg-type]
            estimate = estimate_memory(shape, job)
            predicted = estimate.allocated_bytes - estimate.workspace_bytes
            error = 100 * (predicted - real) / real
            setup = f"{method} {precision} b{batch} s{seq} {attention}{' ckpt' if ckpt else ''}"
            print(
                f"{arch:10s} {setup:34s} {real / 1e6:9.2f} {predicted / 1e6:11.2f} {error:+6.1f}%  "
                f"{phase}/{estimate.peak_phase}",
                flush=True,
            )
            rows.append(
                {
                    "arch": arch,
                    "setup": setup,
                    "real_bytes": real,
                    "analytic_bytes": predicted,
                    "error_pct": round(error, 2),
                    "real_phase": phase,
                    "analytic_phase": estimate.peak_phase,
                }
            )
    errors = [abs(r["error_pct"]) for r in rows]
    summary = {
        "configs": len(rows),
        "median_abs_error_pct": round(statistics.median(errors), 2),
        "max_abs_error_pct": round(max(errors), 2),
    }
    print(
        f"\n{summary['configs']} configs: median |error| {summary['median_abs_error_pct']}%, "
        f"max {summary['max_abs_error_pct']}%"
    )
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "analytic_vs_cpu_step.json").write_text(
        json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n"
    )
    lines = ["| arch | setup | real MB | analytic MB | error |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['arch']} | {r['setup']} | {r['real_bytes'] / 1e6:.2f} | {r['analytic_bytes'] / 1e6:.2f} "
        f"| {r['error_pct']:+.2f}% |"
        for r in rows
    ]
    lines.append(f"\nmedian |error| {summary['median_abs_error_pct']}%, max {summary['max_abs_error_pct']}%")
    (out / "analytic_vs_cpu_step.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
