"""The `rentwise` command: parse, dispatch to one domain call, render; the single error boundary.

Each command lives in its own module and is imported only when it runs, so `rentwise memory` never pays for
the imports of `rentwise train` (the core answers in well under 100 ms).

Exit codes: 0 ok · 1 domain failure (nothing fits, benchmark failed) · 2 usage or config error ·
75 preempted with a checkpoint saved (rerun to resume) · 130 interrupted.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Sequence

import click

from rentwise import __version__
from rentwise.errors import RentwiseError

# name -> (module defining `command`, one-line help shown by `rentwise --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "memory": ("rentwise.cli.memory", "Peak GPU memory of a training or inference job, broken down."),
    "models": ("rentwise.cli.models", "List the bundled model shapes."),
    "gpus": ("rentwise.cli.gpus", "List the GPU spec catalog."),
    "doctor": ("rentwise.cli.doctor", "Is this machine usable? Each check with its fix."),
    "bench": ("rentwise.cli.bench", "Short GPU benchmark: healthy, throttled, shared or not as sold."),
    "watch": ("rentwise.cli.watch", "Live GPU monitor with advice; `-- CMD` wraps a job."),
    "train": ("rentwise.cli.train", "Fine-tune with atomic checkpoints and exact resume after preemption."),
    "checkpoints": ("rentwise.cli.checkpoints", "List a run's checkpoints: valid, partial or corrupt."),
    "plan": ("rentwise.cli.plan", "What to rent for a fine-tune: ranked by the cost of the whole job."),
    "prices": ("rentwise.cli.prices", "List the rental offer catalog, filtered, in your currency."),
    "fix": ("rentwise.cli.fix", "OOM doctor: which component overflows and the fixes, best first."),
    "tco": ("rentwise.cli.tco", "Rent vs buy: break-even busy hours per month."),
}

EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 domain failure (nothing fits, benchmark failed), 2 usage or config error, "
    "75 preempted with a checkpoint saved (rerun to resume), 130 interrupted."
)


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use (click's documented lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[cmd_name][0])
        command: click.Command = module.command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in COMMANDS:
            from rentwise.errors import ConfigError, did_you_mean

            raise ConfigError(
                f"no command named '{name}'{did_you_mean(name, COMMANDS)}",
                hint="run `rentwise --help` to list the commands",
            )
        return super().resolve_command(ctx, args)


@click.group(cls=LazyGroup, epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rentwise")
@click.option("--debug", is_flag=True, help="Show tracebacks for every error (or set RENTWISE_DEBUG=1).")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Will it fit, what should I rent, and run it without losing work."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _is_debug(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get("RENTWISE_DEBUG", "") not in ("", "0")


def print_error(error: RentwiseError) -> None:
    """Print `error: ...` and `  hint: ...` to stderr, the one format every failure uses."""
    click.echo(f"error: {error.message}", err=True)
    if error.hint:
        click.echo(f"  hint: {error.hint}", err=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (tests call this directly)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = _is_debug(args)
    try:
        result = cli.main(args=args, prog_name="rentwise", standalone_mode=False)
    except RentwiseError as error:
        if debug:
            traceback.print_exc()
        print_error(error)
        return error.exit_code
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        return 130
    except click.UsageError as error:
        if debug:
            traceback.print_exc()
        command = error.ctx.command_path if error.ctx else "rentwise"
        click.echo(f"error: {error.format_message()}", err=True)
        click.echo(f"  hint: run `{command} --help`", err=True)
        return 2
    except click.ClickException as error:
        click.echo(f"error: {error.format_message()}", err=True)
        return error.exit_code
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    return result if isinstance(result, int) else 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
