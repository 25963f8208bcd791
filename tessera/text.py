"""Small wording helpers for what users read."""

from __future__ import annotations

from rich.console import Console


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 replica``, ``2 replicas``, ``0 replicas``; ``nouns`` for an irregular plural (``micro-batches``)."""
    if n == 1:
        return f"1 {noun}"
    return f"{n:,} {nouns if nouns is not None else noun + 's'}"


def stdout_console() -> Console:
    """Console for a verb's tables: the terminal's width, or as wide as the content when piped (a file, `| cat`),
    so that no cell is cut to fit 80 columns."""
    return Console(width=None if Console().is_terminal else 10_000)
