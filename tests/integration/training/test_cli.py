"""`rentwise train` and `rentwise checkpoints` through the CLI: exact error lines, resume warnings, output."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import write_tiny_run

RunCli = Callable[..., Any]


def test_missing_config_file(run_cli: RunCli, tmp_path: Path) -> None:
    result = run_cli("train", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"error: config file '{tmp_path / 'nope.yaml'}' does not exist"]


def test_invalid_config_lists_every_problem(run_cli: RunCli, tmp_path: Path) -> None:
    config = write_tiny_run(tmp_path, micro_batch=0, precision="fp8")
    result = run_cli("train", str(config))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: config '{config}' has 2 problems: precision: Input should be 'fp32', 'bf16' or 'fp16'; "
        "micro_batch: Input should be greater than or equal to 1",
        "  hint: docs/train.md lists every field; relative paths are read from the config file's folder",
    ]


@pytest.mark.parametrize(
    ("override", "lines"),
    [
        (
            "method.kind=qlora",
            [
                "error: method qlora needs a CUDA GPU (bitsandbytes 4-bit kernels); this machine has none",
                "  hint: use method.kind: lora on CPU, or run on a CUDA machine",
            ],
        ),
        (
            "precision=fp16",
            [
                "error: precision fp16 needs a CUDA GPU (a grad scaler on CPU is not supported)",
                "  hint: use precision: bf16 or fp32 on CPU",
            ],
        ),
        (
            "model.overrides.vocab_size=200",
            [
                "error: tokenizer has 258 tokens but model '{run}/tiny.json' has a vocabulary of 200",
                "  hint: use the model's own tokenizer, or set model.overrides.vocab_size for a random-init "
                "shape",
            ],
        ),
        (
            "data.format=instruction",
            [
                "error: data file '{run}/data.jsonl' row 1 has no field 'instruction' (it has: text)",
                "  hint: set the data.*_field names in the config to match the file",
            ],
        ),
    ],
)
def test_errors_before_any_training(run_cli: RunCli, tmp_path: Path, override: str, lines: list[str]) -> None:
    config = write_tiny_run(tmp_path)
    result = run_cli("train", str(config), "--set", override)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [line.format(run=tmp_path) for line in lines]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("step-*"))


def test_train_then_list_checkpoints_and_skip_a_corrupt_one(run_cli: RunCli, tmp_path: Path) -> None:
    config = write_tiny_run(tmp_path, max_steps=6)
    result = run_cli("train", str(config), "--no-progress")
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"
    assert result.stdout.splitlines()[0].startswith("trained 6 steps in ")
    assert f"model: {out / 'final'}" in result.stdout

    listed = run_cli("checkpoints", str(out), "--json")
    report = json.loads(listed.stdout)
    assert report["latest"] == "step-000006"
    assert [(c["name"], c["state"]) for c in report["checkpoints"]] == [
        ("step-000003", "valid"),
        ("step-000006", "valid"),
    ]

    weights = out / "step-000006" / "trainable.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    report = json.loads(run_cli("checkpoints", str(out), "--json").stdout)
    assert report["checkpoints"][1]["state"] == "corrupt"
    assert report["checkpoints"][1]["problem"] == "trainable.safetensors does not match its sha256"
    table = run_cli("checkpoints", str(out)).stdout
    assert table.splitlines()[0].split() == ["checkpoint", "step", "state", "size", "note"]
    row = table.splitlines()[1].split()
    assert row[:3] == ["step-000003", "3", "valid"] and row[4] == "MiB"
    assert float(row[3]) == pytest.approx(report["checkpoints"][0]["size_bytes"] / 2**20, abs=0.05)

    resumed = run_cli("train", str(config), "--no-progress", "--set", "lr=0.002")
    assert resumed.exit_code == 0, resumed.stderr
    assert resumed.stderr.splitlines() == [
        "warning: skipping corrupt checkpoint step-000006: trainable.safetensors does not match its sha256",
        "warning: config changed since step-000003; the resumed run will not match an uninterrupted one: "
        "lr: 0.001 -> 0.002",
    ]
    assert "(resumed at step 3)" in resumed.stdout
    assert (out / "step-000006.corrupt").is_dir()


def test_resume_never_refuses_to_overwrite(run_cli: RunCli, tmp_path: Path) -> None:
    config = write_tiny_run(tmp_path, max_steps=3)
    assert run_cli("train", str(config), "--no-progress").exit_code == 0
    result = run_cli("train", str(config), "--no-progress", "--resume", "never")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: output folder '{tmp_path / 'out'}' already has checkpoints (newest step-000003)",
        "  hint: use --resume auto to continue, or choose another output_dir",
    ]


def test_checkpoints_of_a_missing_folder(run_cli: RunCli, tmp_path: Path) -> None:
    result = run_cli("checkpoints", str(tmp_path / "none"))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: folder '{tmp_path / 'none'}' does not exist",
        "  hint: pass the run's output_dir",
    ]


@pytest.mark.parametrize("method", ["full", "lora"])
def test_final_folder_loads_with_plain_transformers_and_peft(
    run_cli: RunCli, tmp_path: Path, method: str
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    config = write_tiny_run(tmp_path, max_steps=2, method={"kind": method})
    assert run_cli("train", str(config), "--no-progress").exit_code == 0
    final = tmp_path / "out" / "final"
    if method == "full":
        model = AutoModelForCausalLM.from_pretrained(final)
    else:
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(final)
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 258)


def test_json_summary_and_eval_and_cost_in_the_log(run_cli: RunCli, tmp_path: Path) -> None:
    config = write_tiny_run(
        tmp_path, max_steps=4, price_per_hour=3.6, data={"eval_fraction": 0.1}, eval_every_steps=2
    )
    result = run_cli("train", str(config), "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["steps"] == 4 and summary["final_dir"] == str(tmp_path / "out" / "final")
    assert summary["cost"] == pytest.approx(summary["elapsed_s"] / 3600 * 3.6)
    events = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e.get("event") == "eval"] == [2, 4]
    steps = [e for e in events if "loss" in e]
    assert all(e["cost"] == pytest.approx(e["elapsed_s"] / 3600 * 3.6) for e in steps)


def test_resume_from_a_given_checkpoint(run_cli: RunCli, tmp_path: Path) -> None:
    config = write_tiny_run(tmp_path, max_steps=6)
    assert run_cli("train", str(config), "--no-progress").exit_code == 0
    out = tmp_path / "out"
    before = (out / "step-000006" / "trainable.safetensors").read_bytes()
    result = run_cli("train", str(config), "--no-progress", "--resume", str(out / "step-000003"))
    assert result.exit_code == 0, result.stderr
    assert "(resumed at step 3)" in result.stdout
    assert (out / "step-000006" / "trainable.safetensors").read_bytes() == before  # the same steps, redone
    assert sorted(p.name for p in out.glob("step-*")) == ["step-000003", "step-000006"]
    missing = run_cli("train", str(config), "--resume", str(out / "step-000099"))
    assert missing.exit_code == 2
    assert missing.stderr.splitlines() == [
        f"error: checkpoint folder '{out / 'step-000099'}' does not exist",
        f"  hint: `rentwise checkpoints {out}` lists them; --resume auto picks the newest valid one",
    ]
