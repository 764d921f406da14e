"""`trace_memory` end to end on tiny models: breakdown, GPU kernels, allocator, methods."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rentwise.memory.breakdown import breakdown_fields
from rentwise.memory.job import MemoryJob
from rentwise.models.shape import ModelShape
from rentwise.trace import CPU_TARGET, TraceTarget, trace_memory
from rentwise.trace.run import record_step

JOB = MemoryJob(method="full", precision="amp_bf16", micro_batch=2, seq_len=64)


def test_breakdown_adds_up_to_the_traced_peak(tiny: Callable[[str], ModelShape]) -> None:
    shape = tiny("llama-gqa")
    result = trace_memory(shape, JOB, target=CPU_TARGET)
    peak = record_step(shape, JOB, CPU_TARGET).tracker.peak().peak_bytes
    assert result.breakdown.allocated_bytes == peak
    assert result.breakdown.source == "trace"
    assert result.breakdown.allocator_slack_bytes == result.breakdown.cuda_context_bytes == 0
    assert set(breakdown_fields()) <= set(result.to_dict()["breakdown"])


def test_full_finetune_peak_holds_weights_grads_and_adam_states(tiny: Callable[[str], ModelShape]) -> None:
    shape = tiny("llama-gqa")
    result = trace_memory(shape, replace(JOB, precision="fp32"), target=CPU_TARGET)
    b = result.breakdown
    params_bytes = 4 * shape.num_params
    assert result.peak_phase == "optimizer_step"  # step 2's: states exist, foreach temporaries on top
    assert b.gradients_bytes == params_bytes
    assert b.optimizer_bytes == 2 * params_bytes  # exp_avg + exp_avg_sq; `step` scalars live on the host
    assert b.weights_bytes >= params_bytes  # + the rotary inv_freq buffers


def test_gpu_target_picks_flash_and_adds_workspace_slack_and_context(
    tiny: Callable[[str], ModelShape],
) -> None:
    progress: list[str] = []
    result = trace_memory(tiny("llama-gqa"), JOB, target=TraceTarget(), progress=progress.append)
    b = result.breakdown
    assert dict(result.attention_kernels) == {"flash": 4}  # 2 layers x 2 steps
    assert b.workspace_bytes == 2 * 32 * 1024**2  # forward thread + autograd thread handles on sm90
    assert b.allocator_slack_bytes > 0 and b.cuda_context_bytes > 0
    assert result.allocator_max_reserved_bytes == b.reserved_bytes
    assert {"step 2/2 forward", "step 2/2 backward", "step 2/2 optimizer_step"} <= set(progress)


def test_eager_attention_materialises_the_score_matrix(tiny: Callable[[str], ModelShape]) -> None:
    shape = tiny("llama-gqa")
    job = replace(JOB, method="lora", seq_len=256)
    eager = trace_memory(shape, replace(job, attention="eager"), target=TraceTarget())
    flash = trace_memory(shape, job, target=TraceTarget())
    assert dict(eager.attention_kernels) == {}
    scores = 2 * 4 * 256 * 256 * 2  # batch x heads x seq^2, bf16, per layer at least
    assert eager.breakdown.activations_bytes - flash.breakdown.activations_bytes > scores


def test_checkpointing_lowers_the_lora_peak(tiny: Callable[[str], ModelShape]) -> None:
    job = replace(JOB, method="lora", seq_len=256)
    plain = trace_memory(tiny("llama-gqa"), job, target=CPU_TARGET)
    checkpointed = trace_memory(tiny("llama-gqa"), replace(job, grad_checkpointing=True), target=CPU_TARGET)
    assert checkpointed.breakdown.activations_bytes < plain.breakdown.activations_bytes


def test_qlora_counts_packed_weights_and_quant_constants(tiny: Callable[[str], ModelShape]) -> None:
    shape = tiny("qwen2-bias")
    result = trace_memory(shape, replace(JOB, method="qlora", precision="bf16"), target=TraceTarget())
    b = result.breakdown
    linear_params = shape.num_layers * sum(
        lin.in_features * lin.out_features for lin in shape.layer_linears()
    )
    assert b.quant_constants_bytes > linear_params // 64  # uint8 absmax per 64 weights + nested constants
    assert b.adapter_bytes > 0


def test_inference_reports_the_kv_cache(tiny: Callable[[str], ModelShape]) -> None:
    shape = tiny("llama-gqa")
    job = MemoryJob(method="inference", precision="bf16", micro_batch=2, seq_len=32, generate_len=4)
    result = trace_memory(shape, job, target=CPU_TARGET)
    kv_per_token = 2 * shape.num_layers * shape.kv_dim * 2  # keys + values, bf16
    assert result.peak_phase in ("prefill", "decode")
    assert result.breakdown.kv_cache_bytes >= 2 * 32 * kv_per_token


def test_moe_qlora_keeps_experts_in_the_compute_dtype(tiny: Callable[[str], ModelShape]) -> None:
    # transformers' bnb integration swaps only nn.Linear; transformers 5 stores experts as 3-D parameters.
    shape = tiny("mixtral-moe")
    job = replace(JOB, method="qlora", precision="bf16", lora_targets=("all-linear",))
    result = trace_memory(shape, job, target=CPU_TARGET)
    expert_params = shape.num_layers * shape.num_experts * 3 * shape.hidden_size * shape.moe_intermediate_size
    assert result.breakdown.weights_bytes > 2 * expert_params
    assert result.breakdown.quant_constants_bytes > 0  # attention projections are 4-bit
    assert any("unquantised" in note for note in result.breakdown.leaves_out)
