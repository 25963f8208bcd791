"""Fixtures shared by every stage's tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tessera.cli import main

RunCli = Callable[[list[str]], tuple[int, str, str]]


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> RunCli:
    """Run `tessera ARGV` in-process: (exit status, stdout, stderr)."""

    def run(argv: list[str]) -> tuple[int, str, str]:
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        cap = capsys.readouterr()
        return code, cap.out, cap.err

    return run
