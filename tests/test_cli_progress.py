"""Issue 17 defects 11 and 12: progress lines when not on a terminal; counts read "1 replica", "2 replicas"."""

from __future__ import annotations

import io
import re

import pytest

from tessera.errors import UserError
from tessera.progress import Steps, progress_mode
from tessera.text import plural


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_lines_when_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_PROGRESS", raising=False)
    buf = io.StringIO()
    with Steps("plan m", total=2, stream=buf) as step:
        step("capture")
        step("solve")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3
    assert re.fullmatch(r"plan m \[1/2\]: capture \(\d+\.\d s\)", lines[0])
    assert re.fullmatch(r"plan m \[2/2\]: solve \(\d+\.\d s\)", lines[1])
    assert re.fullmatch(r"plan m: done in \d+\.\d s", lines[2])
    assert step.started == 2


def test_no_done_line_after_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_PROGRESS", raising=False)
    buf = io.StringIO()
    with pytest.raises(UserError), Steps("advise m", stream=buf) as step:
        step("capture")
        raise UserError("bad")
    assert buf.getvalue().splitlines()[-1].startswith("advise m: capture (")  # the error line comes next


def test_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_PROGRESS", raising=False)
    assert progress_mode(io.StringIO()) == "lines" and progress_mode(_Tty()) == "live"
    monkeypatch.setenv("TESSERA_PROGRESS", "off")
    buf = io.StringIO()
    with Steps("x", stream=buf) as step:
        step("a")
    assert buf.getvalue() == ""
    monkeypatch.setenv("TESSERA_PROGRESS", "lines")
    assert progress_mode(_Tty()) == "lines"
    monkeypatch.setenv("TESSERA_PROGRESS", "loud")
    with pytest.raises(UserError, match="valid: auto, live, lines, off"):
        progress_mode(io.StringIO())


def test_live_spinner_is_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_PROGRESS", "live")
    buf = _Tty()
    with Steps("x", total=2, stream=buf) as step:
        step("a")
        step("b")
    assert "done in" not in buf.getvalue()  # no line left behind; the spinner erased itself


def test_plural() -> None:
    assert plural(1, "replica") == "1 replica"
    assert plural(2, "replica") == "2 replicas" and plural(0, "replica") == "0 replicas"
    assert plural(1, "micro-batch", "micro-batches") == "1 micro-batch"
    assert plural(4, "micro-batch", "micro-batches") == "4 micro-batches"
    assert plural(12_000, "token") == "12,000 tokens"


def test_report_plan_caption_says_one_replica(plan_one_replica) -> None:
    from tessera.report.tables import plan_summary_table

    caption = str(plan_summary_table(plan_one_replica).caption)
    assert "link pcie5, 1 replica" in caption and "replica(s)" not in caption and "1 replicas" not in caption


@pytest.fixture
def plan_one_replica():
    from tessera.contracts.plan import Device, PhasePlan, Plan, StepPoint

    point = StepPoint(batch=8, tokens=8, context=512, microbatches=1, device_busy_s=(1e-3,), link_busy_s=(),
                      latency_s=1e-3, step_s=1e-3)
    return Plan(model="toy", strategy="tessera", mode="throughput",
                devices=(Device(index=0, gpu="H100-SXM", mem_bytes=80_000_000_000),), link="pcie5",
                phases={"decode": PhasePlan(phase="decode", assignment=(0,), microbatches=1, points=(point,))},
                memory_bytes=({"weight": 10**9},), throughput_tokens_per_s=8000.0, usd_per_hour=2.99, solve_s=0.1)
