"""`rentwise train CONFIG`: fine-tune with periodic and on-signal checkpoints and automatic exact resume."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import click

from rentwise.cli.render import emit_json, json_option, stdout_console, warn
from rentwise.errors import ConfigError, require_extra

TRAIN_PACKAGES = ("torch", "transformers", "peft", "accelerate", "safetensors", "pydantic", "yaml", "numpy")


@click.command(
    epilog="Exit 75: stopped by a signal with a checkpoint saved; run the same command again to resume. "
    "Several GPUs: `accelerate launch --multi_gpu --num_processes N -m rentwise.cli.train CONFIG`."
)
@click.argument("config_path", metavar="CONFIG", type=click.Path(path_type=Path))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config field, e.g. --set max_steps=100.",
)
@click.option("--max-steps", type=int, default=None, help="Shortcut for --set max_steps=N.")
@click.option(
    "--output-dir", type=click.Path(path_type=Path), default=None, help="Shortcut for --set output_dir=DIR."
)
@click.option(
    "--resume",
    default="auto",
    show_default=True,
    metavar="auto|never|PATH",
    help="Resume from the newest valid checkpoint, never, or a given checkpoint folder.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar (the metrics log is still written).")
@json_option
def command(
    config_path: Path,
    overrides: tuple[str, ...],
    max_steps: int | None,
    output_dir: Path | None,
    resume: str,
    no_progress: bool,
    as_json: bool,
) -> None:
    """Fine-tune a model (full, LoRA or QLoRA) from a YAML run config; see docs/train.md."""
    for package in TRAIN_PACKAGES:
        require_extra(package, "train")
    from rentwise.training.config import load_config
    from rentwise.training.runner import RunOptions, train

    extra = list(overrides)
    if max_steps is not None:
        extra.append(f"max_steps={max_steps}")
    if output_dir is not None:
        extra.append(f"output_dir={output_dir.resolve()}")
    config = load_config(config_path, extra)
    options = RunOptions(
        resume=resume,
        show_progress=not no_progress and not as_json,
        pause_in_save_s=_seconds_from_env("RENTWISE_TEST_PAUSE_IN_SAVE"),
        step_delay_s=_seconds_from_env("RENTWISE_TEST_STEP_DELAY"),
    )
    result = train(config, options, warn=warn)
    if result.rank != 0:  # under `accelerate launch` only the first process reports
        return
    if as_json:
        emit_json({k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(result).items()})
        return
    console = stdout_console()
    resumed = f" (resumed at step {result.resumed_from})" if result.resumed_from is not None else ""
    console.print(f"trained {result.steps} steps{resumed} in {result.elapsed_s:.1f} s of training time")
    if result.train_loss is not None:
        console.print(f"last loss {result.train_loss:.4f}")
    if result.cost is not None:
        console.print(f"cost {result.cost:.4f} {config.currency} (training time × price_per_hour)")
    console.print(f"model: {result.final_dir}")
    console.print(f"last checkpoint: {result.last_checkpoint}")


def _seconds_from_env(name: str) -> float:
    text = os.environ.get(name, "")
    try:
        return float(text) if text else 0.0
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number of seconds") from None


if __name__ == "__main__":  # `accelerate launch -m rentwise.cli.train CONFIG` starts one of these per process
    import sys

    from rentwise.cli.main import main

    sys.exit(main(["train", *sys.argv[1:]]))
