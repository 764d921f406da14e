from __future__ import annotations

import math

import pytest

from rentwise.hardware.catalog import find_gpu
from rentwise.models.catalog import load_shape
from rentwise.planning.time import (
    compute_seconds,
    data_parallel_bytes_per_step,
    default_utilisation,
    link_gbps,
    matmul_params,
    seconds_for,
    training_flops_per_token,
)


def test_full_training_flops_match_kaplan_plus_palm_attention() -> None:
    # 7e9 params, 32 layers, d = 4096, T = 2048: 6N + 12·L·d·T.
    f = training_flops_per_token(7_000_000_000, 32, 4096, 2048, "full", recompute=False)
    assert f.model == pytest.approx(6 * 7e9 + 12 * 32 * 4096 * 2048)
    assert f.hardware == f.model


def test_recompute_adds_one_forward_which_is_four_thirds_for_full() -> None:
    f = training_flops_per_token(1_000_000_000, 16, 2048, 1024, "full", recompute=True)
    assert f.hardware / f.model == pytest.approx(4 / 3)


def test_lora_skips_weight_gradients() -> None:
    f = training_flops_per_token(7_000_000_000, 32, 4096, 2048, "lora", recompute=False)
    assert f.model == pytest.approx(4 * 7e9 + 12 * 32 * 4096 * 2048)
    ck = training_flops_per_token(7_000_000_000, 32, 4096, 2048, "lora", recompute=True)
    assert ck.hardware - ck.model == pytest.approx(2 * 7e9 + 4 * 32 * 4096 * 2048)


def test_compute_seconds_hand_checked() -> None:
    # 1e9 tokens × 6e10 FLOPs = 6e19 FLOPs; 8 × 989e12 × 0.4 = 3.1648e15 FLOP/s;
    # 6e19 / 3.1648e15 = 18 958.54 s.
    assert compute_seconds(1e9, 6e10, 8, 989, 0.4) == pytest.approx(18_958.54, rel=1e-6)


def test_matmul_params_count_an_untied_head_once() -> None:
    # llama-3.1-8b (untied): 8,030,261,248 parameters (the HF model card's count) minus the 128,256 × 4,096 =
    # 525,336,576 input embedding = 7,504,924,672; the output head is already among the parameters.
    assert matmul_params(load_shape("llama-3.1-8b")) == 7_504_924_672
    # qwen2.5-0.5b (tied): the head reuses the embedding's storage but still multiplies, so all
    # 494,032,768 parameters count.
    assert matmul_params(load_shape("qwen2.5-0.5b")) == 494_032_768


def test_ring_allreduce_volume() -> None:
    # 8 GPUs, 1e9 fp32 gradients: 2 · 7/8 · 4e9 = 7e9 bytes per GPU.
    assert data_parallel_bytes_per_step(10**9, 10**9, 8, "ddp", 4, 2, grad_accum=1) == pytest.approx(7e9)
    # ZeRO-3: 7/8·4e9 (reduce-scatter) + 2·7/8·2e9 (two parameter all-gathers) = 7e9 as well.
    assert data_parallel_bytes_per_step(10**9, 10**9, 8, "zero3", 4, 2, grad_accum=1) == pytest.approx(7e9)
    assert data_parallel_bytes_per_step(10**9, 10**9, 1, "ddp", 4, 2, grad_accum=1) == 0


def test_sharded_collectives_repeat_per_micro_batch() -> None:
    # 8 GPUs, 1e9 parameters, fp32 gradients (4 B), bf16 weights (2 B), 4 micro-batches per step.
    # DDP / ZeRO-1: one all-reduce at the boundary, 2 · 7/8 · 4e9 = 7e9, whatever the accumulation.
    assert data_parallel_bytes_per_step(10**9, 10**9, 8, "ddp", 4, 2, grad_accum=4) == pytest.approx(7e9)
    assert data_parallel_bytes_per_step(10**9, 10**9, 8, "zero1", 4, 2, grad_accum=4) == pytest.approx(7e9)
    # ZeRO-2: 4 reduce-scatters of 7/8 · 4e9 = 1.4e10, one all-gather of 3.5e9: 1.75e10.
    assert data_parallel_bytes_per_step(10**9, 10**9, 8, "zero2", 4, 2, grad_accum=4) == pytest.approx(
        1.75e10
    )
    # ZeRO-3 / FSDP: 4 × (3.5e9 reduce-scatter + 3.5e9 two all-gathers) = 2.8e10.
    assert data_parallel_bytes_per_step(10**9, 10**9, 8, "zero3", 4, 2, grad_accum=4) == pytest.approx(2.8e10)
    assert data_parallel_bytes_per_step(10**9, 10**9, 8, "fsdp", 4, 2, grad_accum=4) == pytest.approx(2.8e10)


def test_nvlink_cut_shows_in_link_bandwidth() -> None:
    a100, a800 = find_gpu("A100 80GB SXM4"), find_gpu("A800 80GB SXM4")
    assert link_gbps(a100, "nvlink") == pytest.approx(300)
    assert link_gbps(a800, "nvlink") == pytest.approx(200)
    assert link_gbps(find_gpu("RTX 4090"), "pcie") == pytest.approx(32)
    assert seconds_for(7e9, 300) < seconds_for(7e9, 200) < seconds_for(7e9, 32)
    assert math.isinf(seconds_for(1.0, None))


def test_utilisation_defaults_are_the_sourced_ones() -> None:
    assert default_utilisation(find_gpu("H100 SXM5"), "full") == pytest.approx(0.40)
    assert default_utilisation(find_gpu("A100 80GB SXM4"), "full") == pytest.approx(0.51)
    assert default_utilisation(find_gpu("A100 80GB SXM4"), "qlora") == pytest.approx(0.3774)  # 0.51 × 0.74
    # A learned full/LoRA share gets the same QLoRA factor: 0.5 × 0.74 = 0.37.
    assert default_utilisation(find_gpu("A100 80GB SXM4"), "qlora", learned=0.5) == pytest.approx(0.37)
    assert default_utilisation(find_gpu("A100 80GB SXM4"), "lora", learned=0.5) == pytest.approx(0.5)
