"""The `tessera` command: thin, one function per verb. Each stage registers its own verbs from its `cli`
module; a verb that spans stages (`tessera plan`: one cell, or a pool's fleet plan) lives here, in
tessera/cli/, above the stages it joins."""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console
from rich.markup import escape

from tessera import __version__
from tessera.errors import os_error_text, plain_os_errors

# rich_markup_mode=None: help text is shown as written ("[[gpu]]" is TOML, not rich markup); the
# context settings reach every sub-command, so `-h` works everywhere.
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]},
                  help="Kernel-granularity disaggregation over heterogeneous GPU pools.")
err = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        print(f"tessera {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the version and exit."),
) -> None:
    """Kernel-granularity disaggregation over heterogeneous GPU pools."""

# Each verb group's module, tessera/cli/<group>.py, exposes register(app); the order is the order of
# `tessera --help`.
STAGES = ("capture", "hardware", "cost", "ptx", "plan", "fleet", "sim", "runtime", "engine", "serve",
          "report", "study")


_registered: list[str] = []  # stages already registered (main may run many times in one process: tests)


def _register_all() -> None:
    for stage in STAGES:
        if stage not in _registered:
            importlib.import_module(f"tessera.cli.{stage}").register(app)
            _registered.append(stage)


def error_line(e: ValueError | OSError) -> str:
    """The one line a user mistake is shown as (no Python "[Errno N]" wording)."""
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {os_error_text(e)}"
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    return plain_os_errors(msg)


def interrupted(e: BaseException) -> bool:
    """Whether ``e`` comes of a KeyboardInterrupt (typer turns Ctrl-C into a silent exit 130)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def main(argv: list[str] | None = None) -> None:
    _register_all()
    try:
        # standalone: click turns usage errors into a message and exit status 2 itself
        app(args=argv, prog_name="tessera")
    except (SystemExit, KeyboardInterrupt) as e:  # Ctrl-C: one line, exit 130 (128 + SIGINT), as a shell's
        if not interrupted(e):
            raise
        err.print("interrupted", highlight=False)
        sys.exit(130)
    except (ValueError, OSError) as e:  # user mistakes: one line, exit 2
        # the message is user text (paths, file contents): no markup, no :emoji: codes
        err.print(f"[bold red]error:[/] {escape(error_line(e))}", highlight=False, soft_wrap=True, emoji=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
