"""`rentwise plan MODEL`: what to rent for a fine-tune, how long it takes and what it really costs.

Memory flags are `rentwise memory`'s (cli/job_options.py). A memory flag left at its default is searched
(micro-batch, checkpointing, sharding, offload); one given on the command line is kept as given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from rentwise.cli.job_options import job_options
from rentwise.cli.render import emit_json, json_option, plain_table, to_jsonable
from rentwise.errors import ConfigError, RentwiseError
from rentwise.planning.job import JobSpec, count_dataset_tokens, tokens_from_samples
from rentwise.planning.offers import BILLING_LABELS, BILLINGS, Currency, Offer, load_offers, parse_fx
from rentwise.planning.planner import SORT_KEYS, PlanResult, plan, recommend
from rentwise.units import parse_size

# Memory flags plan passes to every MemoryJob unchanged when given (the searched ones are built per strategy).
PASSED_THROUGH = ("lora_dropout", "qlora_double_quant", "legacy_logits")


def parse_count(text: str) -> int:
    """'50M', '1.5B', '20000', '2e9' as an integer count."""
    factors = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    cleaned = text.strip().lower().replace("_", "").replace(",", "")
    factor = factors.get(cleaned[-1:], 1.0)
    number = cleaned[:-1] if cleaned[-1:] in factors else cleaned
    try:
        value = float(number) * factor
    except ValueError:
        raise ConfigError(
            f"cannot read '{text}' as a count", hint="write it like 50M, 1.5B or 20000"
        ) from None
    if value <= 0:
        raise ConfigError(f"count '{text}' must be positive", hint="write it like 50M, 1.5B or 20000")
    return int(value)


def offers_options(func: Any) -> Any:
    """--offers, --currency and --fx, shared by plan, prices, fix and tco."""
    func = click.option(
        "--fx",
        multiple=True,
        metavar="CODE=RATE",
        help="Exchange rate as units per US dollar, e.g. CNY=7.1 (repeatable).",
    )(func)
    func = click.option("--currency", default="USD", show_default=True, help="Currency of the output.")(func)
    func = click.option(
        "--offers",
        "offer_files",
        multiple=True,
        type=click.Path(path_type=Path),
        help="Extra offers CSV/TOML; rows with a bundled id replace it (repeatable).",
    )(func)
    return func


def currency_from(code: str, fx: tuple[str, ...]) -> Currency:
    return Currency(code.upper(), parse_fx(fx))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model")
@job_options
@click.option("--tokens", help="Training tokens per epoch, e.g. 50M.")
@click.option("--samples", help="Number of training examples (with --avg-tokens).")
@click.option("--avg-tokens", type=float, help="Average tokens per example.")
@click.option("--dataset", "dataset_file", type=click.Path(path_type=Path), help="Count tokens of this file.")
@click.option("--epochs", type=float, default=1.0, show_default=True)
@click.option("--global-batch", type=int, default=32, show_default=True, help="Sequences per optimizer step.")
@click.option("--allow-method-change", is_flag=True, help="Let the planner switch to LoRA/QLoRA to fit.")
@click.option("--deadline", "deadline_h", type=float, help="Hours the run may take, end to end.")
@click.option("--budget", type=float, help="Most the run may cost, in --currency.")
@click.option("--billing", "billings", multiple=True, type=click.Choice(BILLINGS),
              help="Billing modes to consider (repeatable) [default: on_demand and spot].")  # fmt: skip
@click.option("--max-gpus", type=int, help="Most GPUs in one machine.")
@click.option("--upload", "upload_size", default="0", help="Dataset size to upload, e.g. 2GB.")
@click.option("--keep-checkpoints", "checkpoints_keep", type=int, default=2, show_default=True)
@click.option(
    "--checkpoint-every",
    "checkpoint_every_h",
    type=float,
    default=1.0,
    show_default=True,
    help="Compute hours between checkpoints on on-demand machines (spot: Daly's optimum).",
)
@click.option("--eval-fraction", type=float, default=0.0, show_default=True, help="Eval time / train time.")
@click.option("--snapshot-months", type=float, default=0.0, show_default=True,
              help="Months to keep the result as a snapshot.")  # fmt: skip
@click.option("--spot-mtbi", "spot_mtbi_h", type=float, help="Mean hours between spot interruptions [24].")
@click.option("--restart-min", type=float, help="Minutes to restart after an interruption [10].")
@click.option("--mfu", "utilisation", type=float, help="Share of dense peak reached (0-1) [per GPU family].")
@offers_options
@click.option("--sort", type=click.Choice(SORT_KEYS), default="cost", show_default=True)
@click.option("--top", type=int, default=10, show_default=True, help="Rows to show.")
@json_option
@click.pass_context
def command(ctx: click.Context, /, model: str, as_json: bool, top: int, sort: str, **options: Any) -> int:
    """Rank GPU offers for fine-tuning MODEL by what the whole job costs.

    Memory flags you leave out (--batch, --grad-ckpt, --sharding, --offload) are searched per offer;
    flags you give are kept. Data size: --tokens, --samples with --avg-tokens, or --dataset.

    Example: rentwise plan llama-3.1-8b --method lora --tokens 50M --deadline 12
    """
    from rentwise.models.catalog import load_shape

    shape = load_shape(model)
    currency = currency_from(options.pop("currency"), options.pop("fx"))
    offers = load_offers([Path(p) for p in options.pop("offer_files")], currency)
    job, num_gpus = _job_from(ctx, model, options, shape)
    if num_gpus is not None:
        offers = _with_gpu_count(offers, num_gpus)
    result = plan(shape, job, offers, currency, sort=sort)
    if as_json:
        emit_json({**to_jsonable(result), "recommendation": recommend(result)})
    else:
        _render(result, top)
    return 0 if result.plans else 1


def _with_gpu_count(offers: list[Offer], num_gpus: int) -> list[Offer]:
    """The offers with exactly `num_gpus` GPUs per machine; `RentwiseError` (exit 1) when there are none."""
    kept = [o for o in offers if o.gpu_count == num_gpus]
    if not kept:
        counts = ", ".join(str(n) for n in sorted({o.gpu_count for o in offers}))
        raise RentwiseError(
            f"no offer has {num_gpus} GPUs in one machine (the offers have {counts})",
            hint="pick one of those counts for --gpus, or drop --gpus to search them all",
        )
    return kept


def _job_from(
    ctx: click.Context, model: str, options: dict[str, Any], shape: Any
) -> tuple[JobSpec, int | None]:
    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE

    if options["method"] == "inference":
        raise ConfigError("plan is for training; method 'inference' has no training run to cost",
                          hint="use --method full, lora or qlora")  # fmt: skip
    unsupported = [f"--{flag}" for name, flag in (("tensor_parallel", "tp"), ("context_len", "context"),
                                                  ("generate_len", "generate")) if given(name)]  # fmt: skip
    if unsupported:
        raise ConfigError(
            f"plan does not take {', '.join(unsupported)}: it plans data-parallel training runs",
            hint="drop them; use `rentwise memory` for tensor-parallel or inference memory",
        )
    if given("num_gpus") and options["num_gpus"] < 1:
        raise ConfigError(
            f"--gpus must be at least 1, got {options['num_gpus']}",
            hint="give the GPUs per machine, e.g. --gpus 8, or drop it to search every count",
        )
    extras = tuple((name, options[name]) for name in PASSED_THROUGH if given(name))
    tokens = _tokens(options, shape)
    billings = tuple(options["billings"]) or ("on_demand", "spot")
    targets = tuple(t.strip() for t in str(options["lora_targets"]).split(",") if t.strip())
    restart = options["restart_min"]
    spec = JobSpec(
        model=model, method=options["method"], allow_method_change=options["allow_method_change"],
        precision=options["precision"], optimizer=options["optimizer"], attention=options["attention"],
        lora_rank=options["lora_rank"], lora_targets=targets, seq_len=options["seq_len"], tokens=tokens,
        epochs=options["epochs"], global_batch=options["global_batch"],
        micro_batch=options["micro_batch"] if given("micro_batch") else None,
        grad_checkpointing=options["grad_checkpointing"] if given("grad_checkpointing") else None,
        sharding=options["sharding"] if given("sharding") else None,
        offload=options["offload"] if given("offload") else None,
        deadline_h=options["deadline_h"], budget=options["budget"], billings=billings,
        max_gpus=options["max_gpus"], upload_bytes=parse_size(options["upload_size"], default_unit="gb"),
        checkpoints_keep=options["checkpoints_keep"], checkpoint_every_h=options["checkpoint_every_h"],
        eval_fraction=options["eval_fraction"], snapshot_months=options["snapshot_months"],
        spot_mtbi_h=options["spot_mtbi_h"], restart_s=None if restart is None else restart * 60,
        utilisation=options["utilisation"], memory_extras=extras,
    )  # fmt: skip
    return spec, options["num_gpus"] if given("num_gpus") else None


def _tokens(options: dict[str, Any], shape: Any) -> int:
    sources = [name for name in ("tokens", "samples", "dataset_file") if options[name]]
    if len(sources) > 1:
        flags = ", ".join("--" + name.replace("_file", "") for name in sources)
        raise ConfigError(
            "give the data size one way: --tokens, --samples with --avg-tokens, or --dataset",
            hint=f"drop all but one of {flags}",
        )
    if options["tokens"]:
        return parse_count(options["tokens"])
    if options["samples"]:
        if not options["avg_tokens"]:
            raise ConfigError("--samples needs --avg-tokens", hint="e.g. --samples 20000 --avg-tokens 512")
        return tokens_from_samples(parse_count(options["samples"]), options["avg_tokens"])
    if options["dataset_file"]:
        meta = shape.extra.get("_rentwise") or {}
        hf_id = meta.get("hf_id") if isinstance(meta, dict) else None
        counted = count_dataset_tokens(options["dataset_file"], hf_id or shape.extra.get("_name_or_path"))
        click.echo(f"dataset: {counted.tokens:,} tokens ({counted.method})", err=True)
        return counted.tokens
    raise ConfigError(
        "the job has no data size", hint="give --tokens 50M, --samples N --avg-tokens T, or --dataset FILE"
    )


def _render(result: PlanResult, top: int) -> None:
    cur = result.currency
    click.echo(f"{result.model}: {result.total_tokens / 1e6:,.1f}M tokens, ranked by {result.sort} "
               f"({len(result.plans)} feasible plans, prices in {cur})\n")  # fmt: skip
    rows = [
        [
            str(i), p.offer.label, BILLING_LABELS[p.billing], p.strategy.describe(),
            f"{p.peak_bytes / 2**30:.1f}/{p.capacity_bytes / 2**30:.0f}", f"{p.tokens_per_s:,.0f}",
            f"{p.wall_h:.2f}", f"{p.cost.total:,.2f}",
            f"{p.cost.compute:,.2f}/{p.cost.storage + p.cost.egress + p.cost.snapshot:,.2f}",
            f"{p.cost_per_mtok:,.3f}",
            f"{p.expected_interruptions:.1f}" if p.billing == "spot" else "-",
        ]
        for i, p in enumerate(result.plans[:top], start=1)
    ]  # fmt: skip
    if rows:
        headers = ["#", "offer", "billing", "strategy (mb×accum)", "GiB used/cap", "tok/s", "hours",
                   f"total {cur}", "compute/data", "per Mtok", "preempt"]  # fmt: skip
        click.echo(plain_table(headers, rows, right=[True, False, False, False, True, True, True, True, True,
                                                     True, True]))  # fmt: skip
        click.echo("")
        for line in recommend(result):
            click.echo(line)
    else:
        click.echo("No offer can run this job within the constraints.")
        for p in result.infeasible[:top]:
            click.echo(f"  {p.offer.label} {BILLING_LABELS[p.billing]}: {'; '.join(p.reasons)}")
        # A summary row (no offer id, e.g. "12 offers have no spot price") names its offers in its reason.
        reasons = sorted({(r.reason, r.label if r.offer_id else "") for r in result.rejected})
        for reason, label in reasons[:top]:
            click.echo(f"  {label}: {reason}" if label else f"  {reason}")
    click.echo("\nhours = setup (model download, data upload) + compute + eval + checkpoint writes"
               " + expected preemption loss.")  # fmt: skip
    click.echo("Leaves out: " + "; ".join(result.leaves_out) + ".")
