from __future__ import annotations

import math

import pytest

from rentwise.hardware.catalog import find_gpu
from rentwise.planning.time import (
    compute_seconds,
    data_parallel_bytes_per_step,
    default_utilisation,
    link_gbps,
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
    # 1e9 tokens × 6e10 FLOPs / (8 × 989e12 × 0.4) = 18 958 s.
    assert compute_seconds(1e9, 6e10, 8, 989, 0.4) == pytest.approx(1e9 * 6e10 / (8 * 989e12 * 0.4))


def test_ring_allreduce_volume() -> None:
    # 8 GPUs, 1e9 fp32 gradients: 2 · 7/8 · 4e9 = 7e9 bytes per GPU.
    assert data_parallel_bytes_per_step(10**9, 10**9, 8, "ddp", 4, 2) == pytest.approx(7e9)
    # ZeRO-3: 7/8·4e9 (reduce-scatter) + 2·7/8·2e9 (two parameter all-gathers) = 7e9 as well.
    assert data_parallel_bytes_per_step(10**9, 10**9, 8, "zero3", 4, 2) == pytest.approx(3.5e9 + 3.5e9)
    assert data_parallel_bytes_per_step(10**9, 10**9, 1, "ddp", 4, 2) == 0


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
    assert default_utilisation(find_gpu("A100 80GB SXM4"), "qlora") == pytest.approx(0.51 * 0.74)
