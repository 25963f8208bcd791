"""User-facing errors: one line, exit status 2, never a traceback."""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in what the user gave (name, file, config); the message names the valid choices."""


def choices_error(what: str, got: str, valid: list[str] | tuple[str, ...]) -> UserError:
    shown = ", ".join(sorted(valid))
    return UserError(f"unknown {what} {got!r}; valid: {shown}")
