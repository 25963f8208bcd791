"""CLI verbs of this stage; registered by tessera.cli."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this stage's verbs to the `tessera` app (none yet)."""
