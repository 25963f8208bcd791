"""The `tessera` command: thin, one function per verb; each stage registers its own verbs."""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Kernel-granularity disaggregation over heterogeneous GPU pools.")
err = Console(stderr=True)


@app.callback()
def _root() -> None:
    """Kernel-granularity disaggregation over heterogeneous GPU pools."""

# Each stage's `cli` module exposes register(app); the order is the order of `tessera --help`.
STAGES = ("capture", "hardware", "cost", "ptx", "plan", "fleet", "sim", "runtime", "report")


def _register_all() -> None:
    for stage in STAGES:
        mod = importlib.import_module(f"tessera.{stage}.cli")
        mod.register(app)


def main(argv: list[str] | None = None) -> None:
    _register_all()
    try:
        # standalone: click turns usage errors into a message and exit status 2 itself
        app(args=argv, prog_name="tessera")
    except (ValueError, OSError) as e:  # user mistakes: one line, exit 2
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        # the message is user text (paths, file contents): no markup, no :emoji: codes
        err.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True, emoji=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
