"""The C module's entry points held to their reference-counting contract: objects it borrows stay alive
while Python code it calls (a name's __hash__, a set's __contains__, a value's __eq__) changes the
container they came from, `lines` may be any iterable, and repeated scans leave every shared object's
count as it was. Each hostile case below used to read freed memory (or, for a list as `lines`, crash)."""

from __future__ import annotations

import sys

import pytest

from tessera.ptx import fast
from tessera.ptx.analysis import analyze_ptx, reference_path
from tessera.ptx.lower import COPY, LOAD, S_PARAM

# the extension itself (private by name, it is fast.py's); these tests call it with hostile arguments
_fastscan = pytest.importorskip("tessera.ptx._fastscan")
pytestmark = pytest.mark.skipif(not fast.ENABLED, reason="tessera.ptx._fastscan not built or turned off")

BODY = """.version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 k_param_0, .param .u64 k_param_1)
{
	.reg .b64 %rd<20>;
	ld.param.u64 	%rd1, [k_param_0];
	ld.param.u64 	%rd2, [k_param_1];
	mov.u32 	%r3, %ctaid.x;
	mul.wide.s32 	%rd3, %r3, 4;
	add.s64 	%rd4, %rd2, %rd3;
	ld.global.v2.f32 	{%f1, %f2}, [%rd4+16];
	add.s64 	%rd5, %rd1, %rd3;
	@%p1 st.global.f32 	[%rd5], %f1;
	st.global.f32 	[%rd5+4], %f2;
	ret;
}
"""


def _scanner(lines: object, table: dict, kinds: dict, fparams: object = frozenset(),
             decls: dict | None = None) -> tuple[list, list]:
    transfers: list = []
    sc = _fastscan.Scanner(lines, [], table, kinds, transfers, [], [], {}, fparams, decls or {}, 0)
    return list(sc), transfers


def test_lines_may_be_a_list() -> None:
    # a list has no tp_iternext; the scanner used to call it anyway
    assert _scanner([(0, "x"), (1, "y")], {}, {}) == ([(0, "x"), (1, "y")], [])
    with pytest.raises(TypeError):
        _scanner(5, {}, {})


def test_copy1_sources_emptied_by_a_hash() -> None:
    t: list[str] = []

    class Name(str):
        def __hash__(self) -> int:
            t.clear()
            return str.__hash__(self)

    t.extend(["d", Name("a"), "x" * 40, "y" * 40])
    vals = {"d": 5}
    # d = d | a (a read as 0 and inserted, as defaultdict does); the list is empty after a's hash
    assert fast.first_pass(None, [t], vals, 0, 0, 0) is False  # type: ignore[arg-type]
    assert vals == {"d": 5, "a": 0}


def test_copy_destinations_emptied_by_a_hash() -> None:
    dsts: list[str] = []

    class Name(str):
        def __hash__(self) -> int:
            dsts.clear()
            return str.__hash__(self)

    dsts.extend([Name("q" * 30 + "x"), "r"])
    vals = {"a": 3}
    # the first destination gets a's 3 (a first assignment: no other pass); "r" is gone with the list
    assert fast.first_pass(None, [(COPY, dsts, ["a"])], vals, 0, 0, 0) is False  # type: ignore[arg-type]
    assert vals == {"a": 3, "q" * 30 + "x": 3}


def test_guarded_kinds_entry_dropped_mid_line() -> None:
    wide = int("7" * 31)  # no cached small int: freed with its tuple when the entry goes
    kinds = {"ld.param.u64": (fast.K_LD, (S_PARAM, wide, False), 0, [])}

    class Params:
        def __contains__(self, name: object) -> bool:
            kinds.clear()
            return False

    table = {"\t@%p1": (fast.K_GUARD, None, 0, [], "")}
    left, transfers = _scanner(enumerate(["\t@%p1 ld.param.u64 %rd1, [zz];"]), table, kinds, Params())
    # zz is no parameter: a plain load (lower._load) of zz, in .param space, with the entry's width
    assert left == [] and transfers == [(LOAD, ("%rd1",), ("zz",), S_PARAM, int("7" * 31))]


def test_declaration_dropped_by_its_comparison() -> None:
    decls: dict[str, object] = {}

    class Space:
        def __eq__(self, other: object) -> bool:
            decls.clear()
            return NotImplemented

    decls["zz"] = Space()
    table = {"\tld.param.u64": (fast.K_LD, (S_PARAM, 0, False), 0, [], "ld.param.u64")}
    left, transfers = _scanner(enumerate(["\tld.param.u64 %rd1, [zz];"]), table, {}, decls=decls)
    assert left == [] and transfers == [(LOAD, ("%rd1",), ("zz",), S_PARAM, 0)]


def _counts() -> list[int]:
    """The tables' entries and their parts (small ints left out: any Python code moves their counts)."""
    held = [*fast.PREFIX_TABLE.values(), *fast.KINDS.values()]
    return [sys.getrefcount(x) for e in held for x in (e, *e) if isinstance(x, (tuple, list, str))]


def test_repeated_scans_keep_every_count() -> None:
    analyze_ptx(BODY, "f.ptx")  # learns the prefixes, so the runs below settle lines in C
    before = _counts()
    for _ in range(200):
        analyze_ptx(BODY, "f.ptx")
    assert _counts() == before


def _result(text: str) -> object:
    try:
        return {k: v.to_dict() for k, v in analyze_ptx(text, "f.ptx").items()}
    except ValueError as e:
        return str(e)


def test_truncated_lines_identical() -> None:
    """Every line of BODY cut at every column: the same results as the reference path."""
    analyze_ptx(BODY, "f.ptx")
    lines = BODY.split("\n")
    for i in range(5, len(lines) - 2):
        for j in range(len(lines[i])):
            text = "\n".join([*lines[:i], lines[i][:j], *lines[i + 1:]])
            got = _result(text)
            with reference_path():
                assert got == _result(text), (i, j)
