"""Run config: every problem at once with its field path; overrides, paths, batch arithmetic, exactness."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rentwise.errors import ConfigError, NotFoundError
from rentwise.training.config import apply_override, exactness_changes, load_config


def write(tmp_path: Path, **fields: object) -> Path:
    (tmp_path / "data.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / "tiny.json").write_text('{"model_type": "llama"}')
    config = {
        "model": {"source": "tiny.json"},
        "tokenizer": "bytes",
        "data": {"path": "data.jsonl"},
        "max_steps": 5,
    }
    config.update(fields)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_valid_config_resolves_paths_against_its_folder(tmp_path: Path) -> None:
    config = load_config(write(tmp_path))
    assert config.data.path == tmp_path / "data.jsonl"
    assert config.model.source == str(tmp_path / "tiny.json")
    assert config.output_dir == tmp_path / "runs" / "rentwise"
    assert config.micro_batch == 4 and config.method.kind == "full"


def test_every_problem_is_listed_with_its_field(tmp_path: Path) -> None:
    path = write(tmp_path, micro_batch=0, lrr=0.1, method={"kind": "qlorra"}, data={"path": "missing.jsonl"})
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.message == (
        f"config '{path}' has 4 problems: method.kind: Input should be 'full', 'lora' or 'qlora'; "
        "micro_batch: Input should be greater than or equal to 1; lrr: unknown field; "
        f"data.path: file '{tmp_path / 'missing.jsonl'}' does not exist"
    )


def test_combination_rules(tmp_path: Path) -> None:
    path = write(tmp_path, grad_accum=2, global_batch=16, max_steps=None)
    with pytest.raises(
        ConfigError, match=r"give grad_accum or global_batch, not both; give epochs or max_steps"
    ):
        load_config(path)


def test_unknown_bundled_shape_suggests_a_name(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"model.source: 'llama-3.2-1bb' is neither a path nor a bundled shape"
    ):
        load_config(write(tmp_path, model={"source": "llama-3.2-1bb"}))


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match=r"^config file '.*nope.yaml' does not exist$"):
        load_config(tmp_path / "nope.yaml")


def test_overrides_parse_values_as_yaml(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path), ["micro_batch=3", "method.kind=lora", "method.target_modules=[q_proj]"]
    )
    assert config.micro_batch == 3 and config.method.target_modules == ["q_proj"]
    raw: dict[str, object] = {"a": 1}
    with pytest.raises(ConfigError, match="'a' is not a section"):
        apply_override(raw, "a.b=2")
    with pytest.raises(ConfigError, match="is not KEY=VALUE"):
        apply_override(raw, "novalue")


def test_global_batch_sets_accumulation(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, micro_batch=2, global_batch=16))
    assert config.accumulation_steps(world_size=2) == 4
    with pytest.raises(
        ConfigError, match=r"global_batch 16 is not a multiple of micro_batch × processes = 6"
    ):
        config.accumulation_steps(world_size=3)


def test_exactness_changes_ignore_run_length_and_report_the_rest(tmp_path: Path) -> None:
    before = load_config(write(tmp_path)).model_dump(mode="json")
    longer = load_config(write(tmp_path, max_steps=50, checkpoint={"keep": 9}))
    assert exactness_changes(before, longer) == []
    changed = load_config(write(tmp_path, lr=1e-3, data={"path": "data.jsonl", "max_length": 64}))
    assert exactness_changes(before, changed) == ["data.max_length: 512 -> 64", "lr: 0.0002 -> 0.001"]
