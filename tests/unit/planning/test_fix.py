from __future__ import annotations

from rentwise.hardware.catalog import find_gpu, load_gpus
from rentwise.memory.job import MemoryJob
from rentwise.models.catalog import load_shape
from rentwise.planning.fix import card_from_size, diagnose
from rentwise.planning.offers import bundled_offers


def test_full_finetune_on_a_24gb_card() -> None:
    shape = load_shape("llama-3.1-8b")
    d = diagnose(shape, MemoryJob(method="full", micro_batch=4), find_gpu("RTX 4090"), load_gpus(),
                 bundled_offers())  # fmt: skip
    assert d.over_bytes > 0
    assert d.largest[0][1] == max(size for _, size in d.largest)
    # 8B full fine-tune: the optimizer states alone (8 B/param of Adam moments) exceed 24 GiB.
    assert d.overflowing == ("optimizer states",)
    fitting = [r for r in d.remedies if r.fits]
    assert fitting, "some change must fit"
    # fits come first, and every remedy that fits really is under the card's capacity
    assert d.remedies[: len(fitting)] == tuple(fitting)
    assert all(r.peak_bytes <= r.capacity_bytes for r in fitting)
    changes = " ".join(r.change for r in d.remedies)
    for word in ("LoRA", "QLoRA", "8-bit", "micro-batch", "checkpointing", "bigger card"):
        assert word in changes


def test_checkpointing_costs_a_third_more_time_for_full() -> None:
    shape = load_shape("qwen2.5-0.5b")
    d = diagnose(shape, MemoryJob(method="full", micro_batch=16), find_gpu("T4"), load_gpus())
    ckpt = next(r for r in d.remedies if r.change.startswith("gradient checkpointing ("))
    assert ckpt.relative_time is not None and 1.2 < ckpt.relative_time < 1.34
    assert ckpt.peak_bytes < d.breakdown.total_bytes


def test_card_by_size_uses_catalog_rule() -> None:
    card = card_from_size(24 * 2**30)
    assert card.usable_bytes == int(24 * 2**30 * (1 - 1 / 64))
