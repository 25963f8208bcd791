"""Mutated and truncated PTX: only clean one-line ValueErrors, never another exception.
A modest example count here; bench/bench_ptx.py runs >= 10,000 cases."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.ptx.analysis import analyze_ptx

SEEDS = [p.read_text() for p in sorted((Path(__file__).parent / "corpus" / "sm_90").glob("funcs.ptx"))] + [
    (Path(__file__).parent / "corpus" / "triton" / "tr_add.ptx").read_text()]
JUNK = ["{", "}", ";", "[", "]", "(", ")", ",", "@%p1 ", ".param", "%rd1", "call.uni f, (p);", "\n", "/*", "\"",
        "ld.global.u64 %rd1, [%rd1];", ".entry", ".func", "+", ":", "st.global.f32 [%rd9], %f1;", "x"]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.integers(0, 3))
        i = draw(st.integers(0, len(text)))
        if kind == 0:
            text = text[:i]  # truncation
        elif kind == 1:
            j = draw(st.integers(i, min(len(text), i + 40)))
            text = text[:i] + text[j:]
        elif kind == 2:
            text = text[:i] + draw(st.sampled_from(JUNK)) + text[i:]
        else:
            text = text[:i] + draw(st.text(max_size=6)) + text[i:]
    return text


def check_clean(text: str) -> None:
    try:
        analyze_ptx(text, "f.ptx")
    except ValueError as e:
        assert "\n" not in str(e) and str(e).startswith("f.ptx:"), str(e)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_ptx_fails_cleanly(text: str) -> None:
    check_clean(text)
