"""Typed errors: every user-facing failure is a `RentwiseError` with a message and an optional hint.

Only `rentwise.cli.main` turns these into text and exit codes (STYLE.md §6); library code just raises them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class RentwiseError(Exception):
    """A failure the user can act on. `message` quotes the offending value; `hint` names the next step."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ConfigError(RentwiseError):
    """Bad input: a flag, a config file, a catalog row, an option combination. Exit code 2."""

    exit_code = 2


class NotFoundError(ConfigError):
    """A name (model, GPU, provider, file) that is not known. Exit code 2."""


class MissingExtraError(RentwiseError):
    """An optional dependency is not installed. Exit code 2."""

    exit_code = 2


class PreemptedError(RentwiseError):
    """Training stopped on a signal after saving a checkpoint; rerunning resumes. Exit code 75."""

    exit_code = 75


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """Return ' (did you mean 'x'?)' for the closest known names, or '' when none is close."""
    candidates = list(known)
    lowered = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.6)
    if not close:
        # Substring matches catch 'llama-8b' -> 'llama-3.1-8b', which difflib's ratio can miss.
        close = [c for c in lowered if name.lower() in c][:3]
    if not close:
        return ""
    quoted = " or ".join(f"'{lowered[c]}'" for c in close)
    return f" (did you mean {quoted}?)"


def require_extra(module: str, extra: str) -> None:
    """Raise `MissingExtraError` with the install command when `module` cannot be imported."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(
            f"this needs the '{module}' package, which is not installed",
            hint=f"pip install 'rentwise[{extra}]'",
        )
