"""The C scanner (tessera/ptx/_fastscan.c) against lower.py's pure-Python loop: the same transfers,
sites and declarations for every body, or the same error, on the corpus, on one line of every shape
it settles (and of the near misses it must hand back), and on mutations of both."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sysconfig
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ptx_fuzz import mutated
from test_ptx_lower import lowered_fast, splice

from tessera.ptx import evaluate, lower
from tessera.ptx.parser import parse_ptx
from tessera.ptx.scan import KINDS, PREFIX_TABLE

CORPUS = Path(__file__).parent / "corpus"
NATIVE = lower.native_scanner()
NATIVE_PASS = evaluate.native_first_pass()

needs_native = pytest.mark.skipif(NATIVE is None, reason="tessera.ptx._fastscan not built or turned off")


def _lowered(text: str, native: type | None) -> object:
    saved = lower.NATIVE_SCANNER
    lower.NATIVE_SCANNER = native
    try:
        fns = parse_ptx(text, "f.ptx", lower=lower.lower_body).functions
        return {name: None if fn.lowered is None else
                (fn.lowered.transfers, fn.lowered.sites, fn.lowered.site_addrs, fn.lowered.locals)
                for name, fn in fns.items()}
    except ValueError as e:
        return str(e)
    finally:
        lower.NATIVE_SCANNER = saved


def _same(text: str) -> None:
    assert _lowered(text, NATIVE) == _lowered(text, None)


@pytest.mark.skipif(os.environ.get("TESSERA_PTX_NATIVE", "1") == "0", reason="C module turned off")
def test_built_where_a_c_compiler_exists() -> None:
    # the build skips the extension silently without a compiler (optional=True); with one, a missing
    # or mismatched module would leave CI testing only the pure-Python path
    if shutil.which(sysconfig.get_config_var("CC").split()[0]) is not None:
        assert importlib.util.find_spec("tessera.ptx._fastscan") is not None
        assert NATIVE is not None and NATIVE_PASS is not None  # built, and its constants agree


@needs_native
def test_corpus_lowers_identically_and_mostly_natively() -> None:
    yielded = total = 0
    for f in sorted(CORPUS.glob("*/*.ptx")):
        text = f.read_text()
        _same(text)
        for m in _BODY.finditer(text):  # the lines of each body the scanner hands back to Python
            lines = m.group(1).split("\n")
            total += len(lines)
            yielded += sum(1 for _ in NATIVE(enumerate(lines), [], PREFIX_TABLE, KINDS, [], [], [], {}, set(), {}, 1))
    assert total > 7000
    assert yielded < total / 10  # declarations, brace scopes, call sequences (483): the rest is settled in C


_BODY = re.compile(r"\n\{\n(.*?)\n\}\n", re.S)

HEAD = ".version 8.0\n.target sm_90\n.address_size 64\n"
# every shape the scanner settles, and near misses it must hand back: special registers ("%ctaid.x",
# not "%ctaid.x.y"), shl by >= 32 in any spelling, numbers among sources, shfl's "|", vector loads and
# stores in braces, offsets with blanks and signs, parameter loads/stores (own, callee's, declared),
# cvta to/from shared, mad with 3 and 4 operands, cp.async bookkeeping with and without operands,
# guards before ignored, loaded and stored statements, a label, .loc with and without ";", and
# non-ASCII, CR and NUL characters. Each line alone lowers without error (errors are tested by mutation).
LINES = """\tmov.u32 \t%r3, %ctaid.x;
\tmov.u32 \t%r3, %ctaid.x.y;
\tmov.u32 \t%r3,%ctaid.x;
\tshl.b64 \t%rd5, %rd4, 32;
\tshl.b64 \t%rd5, %rd4, 0032;
\tshl.b64 \t%rd5, %rd4, 031;
\tshl.b64 \t%rd5, %rd4, 100000000000000000000;
\tshl.b64 \t%rd5, %rd4, 3;
\tshl.b64 \t%rd5, %tid.x;
\tmul.wide.s32 \t%rd5, %r4, 4;
\tadd.s64 \t%rd6, %rd4, -16;
\tadd.s64 \t%rd6, %rd4, 0f3F800000;
\tadd.s64 \t%rd6,%rd4;
\tadd.s64 \t%rd6, %rd4, %rd5 ;
\tadd.s64 \t%rd6, %rd4, %rd5;\x20
\tshfl.sync.bfly.b32 \t%r9|%p1, %r8, 16, 31, -1;
\tshfl.sync.bfly.b32 \t%r9|%p1 %r8;
\tld.global.v4.f32 \t{%f1, %f2, %f3, %f4}, [%rd4+16];
\tld.global.v2.f32 \t{ %f1,%f2 }, [ %rd4 + -16 ];
\tld.global.v2.f32 \t{%f1%f2}, [%rd4];
\tld.param.u64 \t%rd1, [k_param_0];
\tld.param.u64 \t%rd1, [k_param_0+8];
\tld.param.u64 \t%rd1, [nowhere];
\tld.shared.u64 \t%rd10, [%r8];
\tld.global.nc.u64 \t%rd11, [%rd4];
\tld.u64 \t%rd12, [%rd11];
\tld.global.f32 \t%f1, [%rd4+];
\tst.global.v4.f32 \t[%rd4], {%f1, %f2, %f3, %f4};
\tst.global.f32 \t[%rd4+4], 0f00000000;
\tst.shared.f32 \t[%r8], %f1 ;
\tst.local.f32 \t[%r8], %f1;
\tst.f32 \t[%rd4], %f1;
\tst.param.b64 \t[k_param_1], %rd1;
\tst.param.b64 \t[nowhere], %rd1;
\tst.global.f32 \t[%rd4], %f1|%f2;
\tst.global.f32 \t[%rd4], ;
\tcvta.to.global.u64 \t%rd4, %rd1;
\tcvta.shared.u64 \t%rd4, %rd1;
\tmad.lo.s32 \t%r4, %r3, 4, %r5;
\tmad.lo.s32 \t%r4, %r3, 4;
\tcp.async.commit_group;
\tcp.async.wait_group 0;
\tcp.async.wait_group 0, 1;
\t@%p1 ld.global.f32 \t%f1, [%rd4];
\t@!%p1 bra \t$L__BB0_2;
\t@%p1 \t  st.global.f32 \t[%rd4], %f1;
\t@%p1 add.s64 \t%rd6, %rd4, 16;
\t@%p1 foo.bar \t%rd6, %rd4;
$L__BB0_2:
\tsetp.ge.s32 \t%p1, %r1, %r2;
\tret;
\t.reg .b32 \t%q<4>;
\t.loc\t1 28 0
\t.loc\t1 28 0;
\t.loc\t1 28 0; mov.u64 \t%rd7, %rd1;
\tbar.sync \t0;\r
\tadd.s64 \t%rd6, %rd4, %rd5;\r
\tadd.s64 \t%rd6, %rd4, %rd\xe9;
\tadd.s64 \t%rd6, %rd4, %rd\x005;
"""
BODY = (HEAD + ".visible .entry k(.param .u64 k_param_0, .param .u64 k_param_1)\n{\n"
        + "\t.reg .b64 %rd<20>;\n\t.param .b64 declared;\n" + LINES + "\tret;\n}\n")


@needs_native
@pytest.mark.parametrize("line", LINES.split("\n")[:-1])
def test_each_line_shape_lowers_identically(line: str) -> None:
    text = BODY.replace(LINES, line + "\n")
    _same(text)
    _same(text.replace("\n", "\n\n"))  # with empty lines between


@needs_native
def test_all_line_shapes_in_one_body() -> None:
    assert not isinstance(_lowered(BODY, None), str)
    _same(BODY)


@needs_native
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_line_shapes_lower_identically(data: st.DataObject) -> None:
    _same(splice(data, BODY, [", ", ",", " ", "\t", "{", "}", "[", "]", "+", "-", "|", ".x", ";", "@%p1 ",
                              "32", "0", "%r1", ":", "\r", "\xe9", "\x00", "\n", "ld.param.u64 ", "k_param_0"]))


@needs_native
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated())
def test_mutated_ptx_lowers_identically(text: str) -> None:
    _same(text)


def _both_passes(ctx: object, transfers: list, vals: defaultdict, *rest: int) -> bool:  # type: ignore[type-arg]
    """evaluate.first_pass run both ways on copies of the same values: the same answer, and the same
    names present with the same bit sets (presence is what the early-stop proof reads)."""
    mine = defaultdict(int, vals)
    again = evaluate.python_first_pass(ctx, transfers, vals, *rest)  # type: ignore[arg-type]
    assert NATIVE_PASS is not None
    assert NATIVE_PASS(ctx, transfers, mine, *rest) == again  # type: ignore[arg-type]
    assert dict(mine) == dict(vals)
    return again


def _analysed_both_ways(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(evaluate, "first_pass", _both_passes)
        checked = lowered_fast(text)
    with monkeypatch.context() as m:
        m.setattr(evaluate, "first_pass", evaluate.python_first_pass)
        assert checked == lowered_fast(text)


@needs_native
def test_native_first_pass_on_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    for f in sorted(CORPUS.glob("*/*.ptx")):
        _analysed_both_ways(f.read_text(), monkeypatch)
    _analysed_both_ways(BODY, monkeypatch)


@needs_native
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated())
def test_native_first_pass_on_mutated_ptx(text: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        _analysed_both_ways(text, mp)


# One transfer of every kind first_pass reads itself, and of those it hands to Python: (transfers,
# initial values, expected "again", expected values of some names). Bits: DATA = 2, LOCAL = 8, P = 32.
D, P = evaluate.DATA, 32
PASS_CASES = [
    ([["%a", "%p"]], {"%p": P}, False, {"%a": P}),  # COPY1 to an absent name: a first assignment
    ([["%a", "%p"]], {"%p": P, "%a": D}, True, {"%a": P | D}),  # grows a present name
    ([["%a", "%z"]], {}, False, {"%a": 0, "%z": 0}),  # reads insert 0, as defaultdict does
    ([(evaluate.SCALE1, ["%a", "%d", "4"])], {"%d": D | P}, False, {"%a": D, "4": 0}),  # offset: DATA only
    ([(evaluate.SCALE1, ["%a", "%d"])], {"%d": D, "%a": 0}, True, {"%a": D}),  # second assignment
    ([(evaluate.SCALE1, ["%a", "%p"])], {"%p": P, "%a": 0}, False, {"%a": 0}),  # no DATA: unchanged
    ([(evaluate.COPY, ("%a", "%b"), ("%p",))], {"%p": P, "%b": D}, True, {"%a": P, "%b": P | D}),
    ([(evaluate.LOAD, ("%a",), ("%x",), evaluate.S_GLOBAL, evaluate.WILD)], {}, False, {"%a": D | 1}),
    ([(evaluate.LOAD, ("%a",), ("%x",), evaluate.S_LOCAL, 0)], {evaluate.MEM: P}, False, {"%a": P | D}),
    ([(evaluate.MAD, ("%a",), ("%d", "%p"), ("%q",))], {"%d": D, "%p": P, "%q": 4 * P}, False,
     {"%a": D | 4 * P}),
    ([(evaluate.SHL_HI, ["%a"], ["%d", "32"])], {"%d": D}, False, {"%a": D | evaluate.WILD}),
    ([["%a", "%a"], (evaluate.SCALE1, ["%b", "%a"]), ["%a", "%p"]], {"%p": P}, True, {"%a": P, "%b": 0}),
]


@needs_native
@pytest.mark.parametrize(("transfers", "init", "again", "expect"), PASS_CASES)
def test_first_pass_each_transfer_kind(transfers: list, init: dict, again: bool, expect: dict) -> None:  # type: ignore[type-arg]
    py, nat = defaultdict(int, init), defaultdict(int, init)
    args = (None, 0, 0, 0)  # amask, a0, p0: no parameter addresses in these cases
    assert evaluate.python_first_pass(args[0], transfers, py, *args[1:]) is again  # type: ignore[arg-type]
    assert NATIVE_PASS(args[0], transfers, nat, *args[1:]) is again  # type: ignore[misc, arg-type]
    assert dict(nat) == dict(py)
    assert {k: py[k] for k in expect} == expect
