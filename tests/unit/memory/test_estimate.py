"""The analytic estimator: sums, hand-checked terms, and properties over random valid jobs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rentwise.memory.activations import dims_for, layer_saved_bytes
from rentwise.memory.breakdown import COMPONENT_LABELS
from rentwise.memory.estimate import estimate_memory
from rentwise.memory.job import MemoryJob
from rentwise.memory.parameters import parameter_bytes
from rentwise.models.catalog import load_shape
from rentwise.units import GIB

SMALL_MODELS = ("qwen2.5-0.5b", "llama-3.2-1b", "qwen3-0.6b", "gemma-2-2b", "qwen3-30b-a3b", "mixtral-8x7b")


def test_components_add_up_to_the_totals() -> None:
    b = estimate_memory(load_shape("qwen2.5-7b"), MemoryJob(method="lora", precision="bf16"))
    components = sum(getattr(b, name) for name in COMPONENT_LABELS)
    assert components == b.total_bytes
    assert b.reserved_bytes == b.allocated_bytes + b.allocator_slack_bytes
    assert b.total_bytes == b.reserved_bytes + b.cuda_context_bytes


def test_full_finetune_amp_adamw_is_sixteen_bytes_per_param_plus_foreach_copy() -> None:
    # fp32 master weights 4 + fp32 grads 4 + Adam moments 8 (torch.optim.AdamW), and foreach AdamW's
    # sqrt(exp_avg_sq) copy (4) during the step: 20 bytes/param at the optimizer step.
    shape = load_shape("llama-3.1-8b")
    p = parameter_bytes(shape, MemoryJob(method="full", precision="amp_bf16", optimizer="adamw"))
    n = shape.num_params
    assert (p.weights, p.gradients, p.optimizer, p.optimizer_temporary) == (4 * n, 4 * n, 8 * n, 4 * n)
    fused = parameter_bytes(shape, MemoryJob(method="full", precision="amp_bf16", optimizer="adamw_fused"))
    assert fused.optimizer_temporary == 0


def test_qlora_nf4_storage_matches_the_qlora_paper() -> None:
    # QLoRA §2: double quantisation costs 8/64 + 32/(64*256) = 0.127 bits per parameter of constants
    shape = load_shape("llama-2-7b")
    p = parameter_bytes(shape, MemoryJob(method="qlora", precision="bf16"))
    linear = sum(lin.in_features * lin.out_features for lin in shape.layer_linears()) * shape.num_layers
    constants_bits = 8 * p.quant_constants / linear
    assert 0.126 < constants_bits < 0.128
    assert p.weights == linear // 2 + (shape.num_params - linear) * 2


def test_kv_cache_is_two_layers_heads_dim_tokens_batch_bytes() -> None:
    shape = load_shape("llama-3.1-8b")  # 32 layers, 8 KV heads x 128
    job = MemoryJob(method="inference", precision="bf16", micro_batch=4, seq_len=100, generate_len=4000)
    b = estimate_memory(shape, job)
    assert b.kv_cache_bytes == 2 * 32 * 8 * 128 * (100 + 4000) * 4 * 2
    assert b.peak_phase == "decode"


def test_eager_attention_adds_the_seq_squared_scores() -> None:
    shape = load_shape("qwen2.5-0.5b")
    sdpa = estimate_memory(shape, MemoryJob(method="full", precision="bf16", seq_len=4096))
    eager = estimate_memory(
        shape, MemoryJob(method="full", precision="bf16", seq_len=4096, attention="eager")
    )
    scores = shape.num_layers * shape.num_heads * 4096 * 4096 * (4 + 2)  # fp32 softmax + bf16 probabilities
    assert eager.activations_bytes - sdpa.activations_bytes == pytest.approx(scores, rel=0.02)


def test_llama_7b_lora_layer_matches_the_autograd_count() -> None:
    # Read off a real CPU step (saved_tensors_hooks, transformers 5, bf16, sdpa) for a middle layer with
    # q_proj/v_proj adapters: both norms' fp32 copy + rsqrt, two fp32 input casts + lora_A outputs,
    # q/k/v/out + fp32 logsumexp, and the gated MLP's gate, act(gate) and up.
    shape = load_shape("llama-2-7b")
    job = MemoryJob(method="lora", precision="bf16", micro_batch=1, seq_len=1024)
    t, h, i, r = 1024, 4096, 11008, 16
    norms = 2 * (4 * t * h + 4 * t)
    expected = norms + 2 * (4 * t * h + 4 * t * r) + 2 * t * 4 * h + 4 * 32 * t + 3 * 2 * t * i
    assert layer_saved_bytes(shape, job, dims_for(job), input_requires_grad=True) == expected


job_strategy = st.builds(
    MemoryJob,
    method=st.sampled_from(["full", "lora", "qlora"]),
    precision=st.sampled_from(["bf16", "amp_bf16"]),
    optimizer=st.sampled_from(["adamw", "adamw_fused", "adamw_8bit", "sgd_momentum"]),
    micro_batch=st.integers(1, 16),
    seq_len=st.integers(16, 8192),
    grad_checkpointing=st.booleans(),
    attention=st.sampled_from(["sdpa", "eager"]),
    lora_rank=st.integers(1, 256),
)


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(SMALL_MODELS), job=job_strategy, factor=st.integers(2, 4))
def test_memory_never_shrinks_as_batch_seq_or_rank_grows(model: str, job: MemoryJob, factor: int) -> None:
    shape = load_shape(model)
    base = estimate_memory(shape, job).total_bytes
    for bigger in (
        dataclasses.replace(job, micro_batch=job.micro_batch * factor),
        dataclasses.replace(job, seq_len=job.seq_len * factor),
        dataclasses.replace(job, lora_rank=job.lora_rank * factor),
    ):
        assert estimate_memory(shape, bigger).total_bytes >= base


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(SMALL_MODELS), job=job_strategy)
def test_lora_needs_no_more_than_full_and_qlora_no_more_than_lora(model: str, job: MemoryJob) -> None:
    # With peft's default q_proj/v_proj targets. Not a law for 'all-linear': peft casts every adapter's input
    # to fp32 separately, which at large batch x seq can outweigh full fine-tuning's optimizer state.
    shape = load_shape(model)
    job = dataclasses.replace(job, lora_targets=("q_proj", "v_proj"))
    full = estimate_memory(shape, dataclasses.replace(job, method="full")).total_bytes
    lora = estimate_memory(shape, dataclasses.replace(job, method="lora")).total_bytes
    qlora = estimate_memory(shape, dataclasses.replace(job, method="qlora")).total_bytes
    assert qlora <= lora <= full


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(SMALL_MODELS), job=job_strategy)
def test_checkpointing_never_raises_activations_or_the_total(model: str, job: MemoryJob) -> None:
    shape = load_shape(model)
    plain = estimate_memory(shape, dataclasses.replace(job, grad_checkpointing=False))
    ckpt = estimate_memory(shape, dataclasses.replace(job, grad_checkpointing=True))
    assert ckpt.activations_bytes <= plain.activations_bytes
    assert ckpt.total_bytes <= plain.total_bytes


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(SMALL_MODELS), job=job_strategy, gpus=st.sampled_from([2, 4, 8]))
def test_sharding_never_costs_more_per_gpu(model: str, job: MemoryJob, gpus: int) -> None:
    shape = load_shape(model)
    per_gpu = [
        estimate_memory(shape, dataclasses.replace(job, num_gpus=gpus, sharding=sharding)).total_bytes
        for sharding in ("ddp", "zero1", "zero2", "zero3")
    ]
    assert per_gpu[3] <= per_gpu[2] <= per_gpu[1] <= per_gpu[0]


def test_seven_b_lora_answer_is_in_the_range_people_report() -> None:
    # Qwen2.5-7B LoRA, bf16 base, seq 2048, batch 1, checkpointing: the bf16 weights alone are 14.2 GiB.
    job = MemoryJob(method="lora", precision="bf16", grad_checkpointing=True)
    b = estimate_memory(load_shape("qwen2.5-7b"), job)
    assert 15 * GIB < b.total_bytes < 24 * GIB


def test_importing_the_core_does_not_import_torch() -> None:
    code = (
        "import sys, rentwise, rentwise.memory.estimate, rentwise.memory.fit, rentwise.models.catalog, "
        "rentwise.hardware.catalog, rentwise.cli.memory; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
