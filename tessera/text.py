"""Small wording helpers for what users read."""

from __future__ import annotations


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 replica``, ``2 replicas``, ``0 replicas``; ``nouns`` for an irregular plural (``micro-batches``)."""
    if n == 1:
        return f"1 {noun}"
    return f"{n:,} {nouns if nouns is not None else noun + 's'}"
