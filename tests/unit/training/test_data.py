"""Data: file formats, errors that name the file/row/field, loss masks, packing, and the index sampler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rentwise.errors import ConfigError
from rentwise.training.config import DataConfig
from rentwise.training.data import (
    IGNORE_INDEX,
    ByteTokenizer,
    Sampler,
    build_examples,
    collate,
    pack,
    read_rows,
    split_eval,
)


def test_reads_jsonl_json_csv_and_text(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n\n{"text": "y"}\n')
    (tmp_path / "a.json").write_text('[{"text": "x"}]')
    (tmp_path / "a.csv").write_text("text,other\nx,1\n")
    (tmp_path / "a.txt").write_text("x\n\ny\n")
    assert read_rows(tmp_path / "a.jsonl") == [{"text": "x"}, {"text": "y"}]
    assert read_rows(tmp_path / "a.json") == [{"text": "x"}]
    assert read_rows(tmp_path / "a.csv") == [{"text": "x", "other": "1"}]
    assert read_rows(tmp_path / "a.txt") == [{"text": "x"}, {"text": "y"}]


def test_bad_rows_name_file_and_row(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "x"}\n{"text": \n')
    with pytest.raises(ConfigError, match=rf"^data file '{path}' row 2 is not valid JSON"):
        read_rows(path)
    with pytest.raises(ConfigError, match=r"unknown extension '.xlsx'"):
        (tmp_path / "a.xlsx").write_text("")
        read_rows(tmp_path / "a.xlsx")


def test_missing_field_names_row_and_fields(tmp_path: Path) -> None:
    rows = [{"instruction": "a", "response": "b"}, {"instruction": "a", "output": "b"}]
    config = DataConfig(path=tmp_path / "d.jsonl", format="instruction")
    with pytest.raises(ConfigError) as caught:
        build_examples(rows, config, ByteTokenizer(), config.path)
    assert caught.value.message == (
        f"data file '{config.path}' row 2 has no field 'response' (it has: instruction, output)"
    )


def test_instruction_loss_is_on_the_response_only(tmp_path: Path) -> None:
    config = DataConfig(path=tmp_path / "d.jsonl", format="instruction")
    (example,) = build_examples(
        [{"instruction": "hi", "response": "yo"}], config, ByteTokenizer(), config.path
    )
    text = bytes(i for i in example.input_ids if i < 256).decode()
    assert text == "<|user|>\nhi<|assistant|>\nyo"
    trained = [i for i, label in zip(example.input_ids, example.labels, strict=True) if label != IGNORE_INDEX]
    assert trained == [*b"yo", ByteTokenizer.eos_id]


def test_chat_rows_need_role_and_content(tmp_path: Path) -> None:
    config = DataConfig(path=tmp_path / "d.jsonl", format="chat")
    with pytest.raises(ConfigError, match=r"row 1 message 2 needs 'role' and 'content' fields"):
        build_examples(
            [{"messages": [{"role": "user", "content": "a"}, {"text": "b"}]}],
            config,
            ByteTokenizer(),
            config.path,
        )


def test_truncation_and_packing(tmp_path: Path) -> None:
    config = DataConfig(path=tmp_path / "d.jsonl", max_length=8)
    examples = build_examples(
        [{"text": "abcdefghijkl"}, {"text": "xy"}], config, ByteTokenizer(), config.path
    )
    assert [len(e.input_ids) for e in examples] == [8, 3]
    packed = pack(examples, 4)
    assert [len(e.input_ids) for e in packed] == [4, 4]  # 11 tokens -> two full blocks, the rest dropped


def test_collate_pads_without_loss_or_attention() -> None:
    config = DataConfig(path=Path("x"), max_length=8)
    examples = build_examples([{"text": "abc"}, {"text": "a"}], config, ByteTokenizer(), config.path)
    batch = collate(examples, ByteTokenizer.pad_id)
    assert batch["input_ids"].shape == (2, 4)
    assert batch["labels"][1].tolist() == [97, 256, IGNORE_INDEX, IGNORE_INDEX]
    assert batch["attention_mask"][1].tolist() == [1, 1, 0, 0]


def test_split_eval_is_seeded_and_disjoint() -> None:
    config = DataConfig(path=Path("x"))
    examples = build_examples([{"text": str(i)} for i in range(20)], config, ByteTokenizer(), config.path)
    train, held = split_eval(examples, 0.25, seed=3)
    assert len(held) == 5 and len(train) == 15
    assert split_eval(examples, 0.25, seed=3) == (train, held)
    assert not set(train) & set(held)


@given(
    num_examples=st.integers(8, 200),
    micro=st.sampled_from([1, 2, 4]),
    world=st.sampled_from([1, 2]),
    accum=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 5),
)
def test_sampler_covers_each_epoch_once_and_is_a_function_of_the_step(
    num_examples: int, micro: int, world: int, accum: int, seed: int
) -> None:
    sampler = Sampler(num_examples, micro * accum * world, world, seed)
    if sampler.steps_per_epoch == 0:
        return
    seen = [
        i
        for step in range(sampler.steps_per_epoch)
        for r in range(world)
        for i in sampler.step_indices(step, r)
    ]
    assert len(seen) == len(set(seen)) == sampler.steps_per_epoch * sampler.global_batch
    step = sampler.steps_per_epoch + 1  # second epoch: a different order, same answer from scratch
    assert sampler.step_indices(step, world - 1) == Sampler(
        num_examples, sampler.global_batch, world, seed
    ).step_indices(step, world - 1)
    assert sampler.epoch_order(0) != sampler.epoch_order(1) or num_examples < 3


def test_rows_in_json_are_objects(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"text": "x"}, 3]))
    with pytest.raises(ConfigError, match=r"row 2 is not an object"):
        read_rows(path)
