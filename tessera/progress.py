"""Progress for long work: a rich spinner on a terminal, plain timestamped lines otherwise.

    with Steps("plan llama-3-70b", total=3) as step:
        step("capture prefill")      # each call starts a step; the previous one is done
        step("solve the MILP")

On a terminal the spinner (and a bar with M/N when ``total`` is given) is transient: it is gone when the
block ends, so tables printed afterwards stand alone. When the stream is not a terminal (a pipe, a log
file, CI) every step is one line, ``plan llama-3-70b [2/3]: solve the MILP (12.4 s)``, flushed at once,
and the block ends with ``plan llama-3-70b: done in 13.0 s`` (nothing when it ends by an exception: the
error line follows). Lines go to stderr unless told, so ``--json`` output on stdout stays clean.
``TESSERA_PROGRESS=off`` silences both forms, ``=lines`` forces lines, ``=live`` forces the spinner.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from tessera.errors import UserError

ENV_VAR = "TESSERA_PROGRESS"
MODES = ("auto", "live", "lines", "off")


def progress_mode(stream: TextIO) -> str:
    """live | lines | off: the env var's choice, else live on a terminal and lines otherwise."""
    mode = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise UserError(f"{ENV_VAR}={mode!r} is not valid; valid: {', '.join(MODES)}")
    if mode == "auto":
        return "live" if stream.isatty() else "lines"
    return mode


class Steps:
    """Context manager; calling it with a description starts the next step (see the module docstring)."""

    def __init__(self, title: str, *, total: int | None = None, stream: TextIO | None = None) -> None:
        if total is not None and total < 1:
            raise ValueError(f"total={total} must be >= 1 (or None for an open-ended count)")
        self.title, self.total = title, total
        self.stream = stream if stream is not None else sys.stderr
        self.mode = progress_mode(self.stream)
        self.started = 0  # steps begun so far; all but the last are done
        self._t0_s = time.perf_counter()
        self._live: Progress | None = None
        self._task = 0

    def __enter__(self) -> Steps:
        self._t0_s = time.perf_counter()
        if self.mode == "live":
            cols = [SpinnerColumn(), TextColumn("{task.description}")]
            if self.total is not None:
                cols += [BarColumn(), MofNCompleteColumn()]
            self._live = Progress(*cols, TimeElapsedColumn(), console=Console(file=self.stream), transient=True)
            self._live.__enter__()
            self._task = self._live.add_task(self.title, total=self.total)
        return self

    def __call__(self, desc: str) -> None:
        """Start the step ``desc``; the one before it (if any) counts as done."""
        self.started += 1
        if self._live is not None:
            self._live.update(self._task, description=f"{self.title}: {desc}", completed=self.started - 1)
        elif self.mode == "lines":
            count = f" [{self.started}/{self.total}]" if self.total is not None else ""
            self._line(f"{self.title}{count}: {desc} ({self.elapsed_s:.1f} s)")

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self._t0_s

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(kind, exc, tb)
            self._live = None
        elif self.mode == "lines" and kind is None:
            self._line(f"{self.title}: done in {self.elapsed_s:.1f} s")
