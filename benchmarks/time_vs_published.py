"""Predicted training throughput (planning/time.py) vs published measurements, with the error per row.

Sources (every row below is copied from one of them):
- llm-foundry, scripts/train/benchmarking/README.md (mosaicml/llm-foundry): MPT models, 8 GPUs, FSDP
  FULL_SHARD, amp_bf16, tokens/s/GPU. NumParams, seq len, global batch and checkpointing are the table's.
  MPT d_model / n_layers by size are the llm-foundry yamls' (1b 2048/24, 3b 2560/32, 7b 4096/32,
  13b 5120/40, 30b 7168/48). GradAccum (micro-batches per step) is the table's too: FSDP FULL_SHARD gathers
  the parameters and reduce-scatters the gradients in every micro-batch, so it multiplies the traffic.
- Qwen (QwenLM/Qwen README, "Profiling of Memory and Speed"): one A100-SXM4-80G, batch 1 × accumulation 8,
  flash attention 2, gradient checkpointing on (finetune/finetune_lora_single_gpu.sh passes
  --gradient_checkpointing); s/it converted to tokens/s = 8 × seq / s_per_it. Model sizes from the
  Qwen-1.8B/7B/14B config.json files (hidden, layers, heads, MLP width per projection, vocab; untied
  output head, so it is already among the parameters).

MFU assumptions are the planner's defaults (planning/time.py): utilisation of dense bf16 peak on hardware
FLOPs = 0.40 on Hopper, 0.51 on Ampere, × 0.74 for QLoRA. Caveat: the Hopper/Ampere figures come from the
same llm-foundry table, so those rows test the FLOPs and communication model and the spread of utilisation
across sizes, not an independent prediction; the Qwen rows are independent of the defaults for LoRA.

Run: python benchmarks/time_vs_published.py
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from rentwise.hardware.catalog import find_gpu
from rentwise.models.shape import ModelShape
from rentwise.planning.time import (
    compute_seconds,
    data_parallel_bytes_per_step,
    default_utilisation,
    link_gbps,
    matmul_params,
    peak_tflops,
    seconds_for,
    training_flops_per_token,
)

ROOT = Path(__file__).resolve().parent
MPT_DIMS = {"1b": (2048, 24), "3b": (2560, 32), "7b": (4096, 32), "13b": (5120, 40), "30b": (7168, 48)}
QWEN = {  # hidden, layers, heads, per-projection MLP width, vocab (Qwen-*B config.json; qkv has a bias)
    "qwen-1.8b": (2048, 24, 16, 5504, 151936),
    "qwen-7b": (4096, 32, 32, 11008, 151936),
    "qwen-14b": (5120, 40, 40, 13696, 152064),
}


@dataclass(frozen=True)
class Published:
    source: str
    model: str
    gpu: str
    gpus: int
    method: str
    seq: int
    global_batch: int
    """Sequences per optimizer step."""
    grad_accum: int
    """Micro-batches per optimizer step (llm-foundry's GradAccum column; Qwen's accumulation 8)."""
    recompute: bool
    tokens_per_s_per_gpu: float
    num_params: int = 0
    """MPT: NumParams from the table (tied embeddings, so all of them multiply)."""


LLM_FOUNDRY = "llm-foundry benchmarking README"
QWEN_README = "QwenLM/Qwen README profiling table"
ROWS = (
    Published(LLM_FOUNDRY, "mpt-1b", "H100 SXM5", 8, "full", 2048, 112, 1, False, 45455, 1315950592),
    Published(LLM_FOUNDRY, "mpt-3b", "H100 SXM5", 8, "full", 4096, 240, 6, False, 20964, 2657080320),
    Published(LLM_FOUNDRY, "mpt-7b", "H100 SXM5", 8, "full", 2048, 48, 1, False, 10643, 6658859008),
    Published(LLM_FOUNDRY, "mpt-7b", "H100 SXM5", 8, "full", 4096, 256, 2, True, 8611, 6667247616),
    Published(LLM_FOUNDRY, "mpt-13b", "H100 SXM5", 8, "full", 2048, 16, 1, False, 4792, 12853954560),
    Published(LLM_FOUNDRY, "mpt-30b", "H100 SXM5", 8, "full", 2048, 504, 21, True, 2002, 29975214080),
    Published(LLM_FOUNDRY, "mpt-1b", "A100 80GB SXM4", 8, "full", 2048, 448, 4, False, 20513, 1315950592),
    Published(LLM_FOUNDRY, "mpt-3b", "A100 80GB SXM4", 8, "full", 2048, 160, 2, False, 10811, 2651837440),
    Published(LLM_FOUNDRY, "mpt-7b", "A100 80GB SXM4", 8, "full", 2048, 96, 2, False, 4641, 6658859008),
    Published(LLM_FOUNDRY, "mpt-7b", "A100 80GB SXM4", 8, "full", 4096, 256, 2, True, 3684, 6667247616),
    Published(LLM_FOUNDRY, "mpt-13b", "A100 80GB SXM4", 8, "full", 2048, 48, 3, False, 2262, 12853954560),
    Published(LLM_FOUNDRY, "mpt-30b", "A100 80GB SXM4", 8, "full", 2048, 504, 21, True, 916, 29975214080),
    Published(QWEN_README, "qwen-1.8b", "A100 80GB SXM4", 1, "lora", 2048, 8, 8, True, 8 * 2048 / 1.7),
    Published(QWEN_README, "qwen-7b", "A100 80GB SXM4", 1, "lora", 2048, 8, 8, True, 8 * 2048 / 5.2),
    Published(QWEN_README, "qwen-7b", "A100 80GB SXM4", 1, "lora", 4096, 8, 8, True, 8 * 4096 / 10.1),
    Published(QWEN_README, "qwen-14b", "A100 80GB SXM4", 1, "lora", 2048, 8, 8, True, 8 * 2048 / 8.4),
    Published(QWEN_README, "qwen-7b", "A100 80GB SXM4", 1, "qlora", 2048, 8, 8, True, 8 * 2048 / 7.0),
    Published(QWEN_README, "qwen-14b", "A100 80GB SXM4", 1, "qlora", 2048, 8, 8, True, 8 * 2048 / 11.8),
)


def sizes(row: Published) -> tuple[int, int, int, int]:
    """(matmul params, total params, layers, attention width) of the row's model."""
    if row.model.startswith("mpt-"):
        hidden, layers = MPT_DIMS[row.model.removeprefix("mpt-")]
        return row.num_params, row.num_params, layers, hidden
    hidden, layers, heads, mlp, vocab = QWEN[row.model]
    shape = ModelShape(name=row.model, model_type="llama", hidden_size=hidden, num_layers=layers,
                       num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads, intermediate_size=mlp,
                       vocab_size=vocab, qkv_bias=True)  # fmt: skip
    params = matmul_params(shape)
    return params, shape.num_params, layers, hidden


def predict(row: Published) -> tuple[float, float, float]:
    """Predicted tokens/s/GPU, the same without communication, and the measurement's implied utilisation."""
    gpu = find_gpu(row.gpu)
    params, total, layers, width = sizes(row)
    flops = training_flops_per_token(params, layers, width, row.seq, row.method, row.recompute).hardware
    peak = peak_tflops(gpu, "amp_bf16")
    assert peak is not None
    utilisation = default_utilisation(gpu, row.method)
    tokens = row.global_batch * row.seq
    compute = compute_seconds(tokens, flops, row.gpus, peak, utilisation)
    trainable = total if row.method == "full" else 0  # LoRA adapters: negligible traffic, single GPU here
    comm_bytes = data_parallel_bytes_per_step(
        trainable, total, row.gpus, "fsdp", 4, 2, grad_accum=row.grad_accum
    )
    comm = seconds_for(comm_bytes, link_gbps(gpu, "nvlink"))
    predicted = tokens / (compute + comm) / row.gpus
    implied = row.tokens_per_s_per_gpu * flops / (peak * 1e12)
    return predicted, tokens / compute / row.gpus, implied


def _row(r: dict[str, object]) -> str:
    return (
        f"| {r['source']} | {r['model']} | {r['gpu']} × {r['gpus']} | {r['method']} | {r['seq']} | "
        f"{'yes' if r['recompute'] else 'no'} | {r['measured_tok_s_gpu']:,.0f} | "
        f"{r['predicted_tok_s_gpu']:,.0f} | {r['error']:+.0%} | {r['error_without_communication']:+.0%} | "
        f"{r['implied_utilisation']:.2f} |"
    )


def main() -> None:
    results: list[dict[str, object]] = []
    for row in ROWS:
        predicted, compute_only, implied = predict(row)
        results.append({
            "source": row.source, "model": row.model, "gpu": row.gpu, "gpus": row.gpus, "method": row.method,
            "seq": row.seq, "recompute": row.recompute, "measured_tok_s_gpu": row.tokens_per_s_per_gpu,
            "predicted_tok_s_gpu": predicted, "error": predicted / row.tokens_per_s_per_gpu - 1,
            "error_without_communication": compute_only / row.tokens_per_s_per_gpu - 1,
            "implied_utilisation": implied,
        })  # fmt: skip
    abs_errors = [abs(float(r["error"])) for r in results]
    lines = [
        "# Predicted vs published training throughput (tokens/s per GPU)",
        "",
        "Utilisation defaults: Hopper 0.40, Ampere 0.51 of dense bf16 peak on hardware FLOPs, QLoRA × 0.74.",
        "",
        "| source | model | GPU × n | method | seq | recompute | measured | predicted | error "
        "| error w/o comm | implied util. |",
        "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|",
        *(_row(r) for r in results),
        "",
        f"Median |error| {statistics.median(abs_errors):.0%}, max {max(abs_errors):.0%} over {len(results)} "
        "rows. Communication is modelled without overlap (llm-foundry's FSDP overlaps it), so multi-GPU",
        "rows are pessimistic; the defaults are the low ends of the published utilisation ranges, so the",
        "planner errs towards longer runs and higher costs.",
    ]
    text = "\n".join(lines)
    print(text)
    out = ROOT / "results"
    out.mkdir(exist_ok=True)
    (out / "time_vs_published.md").write_text(text + "\n")
    (out / "time_vs_published.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
