"""The speed work must not change a result: the fixpoint's early stop, the learnt line prefixes of the
fast lowering, and the direct construction of frozen dataclasses, each against the plain way."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ptx_fuzz import mutated
from test_ptx_lower import SHAPES, lowered_fast, lowered_reference, splice

from tessera.ptx import evaluate, lower
from tessera.ptx.analysis import Access, EntryAccess, ParamAccess, analyze_ptx
from tessera.ptx.parser import Function, Param, make, parse_ptx

CORPUS = Path(__file__).parent / "corpus"
TEXTS = [f.read_text() for f in sorted(CORPUS.glob("*/*.ptx"))]

HEAD = ".version 8.0\n.target sm_90\n.address_size 64\n"
# Triton / inline-asm shapes: statements in braces on one line, guarded loads and atomics with spaced
# operands, a label in column 0, a whole-line statement ("ret;"), .loc lines with and without ";",
# trailing blanks after a ";", a loop-carried pointer, a shared-memory round trip
TRITON = HEAD + """.visible .entry t(.param .u64 .ptr .global .align 1 t_param_0, .param .u64 t_param_1,
\t.param .u32 t_param_2)
.reqntid 128
{
\t.reg .pred \t%p<3>;
\t.reg .b32 \t%r<20>;
\t.reg .b64 \t%rd<20>;
\t.shared .align 4 .b8 sm[64];
\t.loc\t1 28 0\x20\x20\x20
$L__func_begin0:
\tld.param.b64 \t%rd5, [t_param_0];
\tld.param.u64 \t%rd6, [ t_param_1 ];
\tmov.u32 \t%r6, %ctaid.x;
\tmul.wide.s32 \t%rd7, %r6, 4;
\tadd.s64 \t%rd1, %rd5, %rd7;\x20\t
\t// begin inline asm
\tmov.u32 %r1, %r2;
\t@%p1 ld.global.b32 { %r1 }, [ %rd1 + 0 ];
\t{  cvt.rn.f16.f32 %rs1, %f1;}
\t{.reg .f16 low,high;
  mov.b32 {low,high},%r6;
  cvt.f32.f16 %f1, low;}
\t@%p2 atom.global.gpu.acq_rel.add.f32 %r4, [ %rd6 + 0 ], %r5;
\tmov.u32 \t%r8, sm;
\tst.shared.u64 \t[%r8], %rd9;
\tld.shared.u64 \t%rd10, [%r8];
\tst.global.b32 \t[%rd10], %r1;
$L__loop:
\tshfl.sync.bfly.b32 \t%r9|%p1, %r8, 16, 31, -1;
\tadd.s64 \t%rd9, %rd11, 16;
\tmov.u64 \t%rd11, %rd5;
\t@%p1 bra \t$L__loop;
\t.loc\t1 32 9;
\tret;
}
"""


def _results(text: str) -> object:
    try:
        return {k: v.to_dict() for k, v in analyze_ptx(text, "f.ptx").items()}
    except ValueError as e:
        return str(e)


def test_triton_shapes_agree_with_reference_and_are_lowered() -> None:
    assert lowered_fast(TRITON) == lowered_reference(TRITON)
    assert all(fn.lowered is not None for fn in parse_ptx(TRITON, "f.ptx", lower=lower.lower_body).functions.values())
    got = lowered_fast(TRITON)["t"]  # type: ignore[index]
    # t_param_0: read (the guarded load), then spilled to shared memory and written through;
    # t_param_1: atomic; the u32 is no pointer
    assert [p["access"] for p in got["params"]] == ["read-write", "atomic", "untouched"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fast_path_matches_reference_on_mutated_triton_shapes(data: st.DataObject) -> None:
    text = splice(data, TRITON, ["", ".", "|", "%r9", ", ", "{", "}", ";", " ", "\t", "-", "+4", "\n", "ret;", ": ",
                                 "@%p1 "])
    assert lowered_fast(text) == lowered_reference(text)


def test_learnt_prefixes_change_nothing() -> None:
    """Cold (nothing learnt), warm, and reference results agree on every corpus module."""
    saved = dict(lower.PREFIX_TABLE)
    try:
        lower.PREFIX_TABLE.clear()
        cold = [_results(t) for t in TEXTS + [SHAPES, TRITON]]
        warm = [_results(t) for t in TEXTS + [SHAPES, TRITON]]
    finally:
        lower.PREFIX_TABLE.update(saved)
    assert cold == warm == [lowered_reference(t) for t in TEXTS + [SHAPES, TRITON]]


def _always_iterate(monkeypatch: pytest.MonkeyPatch) -> None:
    first = evaluate.first_pass
    monkeypatch.setattr(evaluate, "first_pass", lambda *a: first(*a) or True)


def test_fixpoint_early_stop_changes_nothing_on_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = [_results(t) for t in TEXTS + [SHAPES, TRITON]]
    _always_iterate(monkeypatch)
    assert fast == [_results(t) for t in TEXTS + [SHAPES, TRITON]]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fixpoint_early_stop_changes_nothing_on_mutated_ptx(text: str) -> None:
    fast = _results(text)
    with pytest.MonkeyPatch.context() as mp:
        _always_iterate(mp)
        assert _results(text) == fast


@pytest.mark.parametrize(("cls", "fields"), [
    (Param, {"name": "p", "type": ".u64", "count": None, "align": None, "ptr_space": None}),
    (Function, {"name": "f", "is_entry": True, "params": (), "returns": (), "body": None, "locals": {}, "line": 3,
                "body_offset": 9, "lowered": None}),
    (ParamAccess, {"name": "p", "type": ".u64", "access": Access.READ, "reads": 1, "writes": 0, "atomics": 0,
                   "conservative": 0, "data_dependent": False}),
    (EntryAccess, {"name": "k", "params": (), "indirect": False, "reasons": (), "globals": {}}),
])
def test_make_equals_construction(cls: type, fields: dict[str, object]) -> None:
    assert set(fields) == {f.name for f in dataclasses.fields(cls)}  # make needs every field
    made, built = make(cls, dict(fields)), cls(**fields)
    assert made == built and repr(made) == repr(built)
    if cls is not EntryAccess:  # its globals dict makes it unhashable either way
        assert hash(made) == hash(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.name = "x"  # type: ignore[misc]
