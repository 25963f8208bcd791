"""Exact stand-ins added for speed, each against what it replaced: the regex combinations and str-method
rewrites agree with the original patterns on random text, and the parser's line numbers and the fast
path's results agree with the reference path on every corpus module and on mutated PTX."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ptx_fuzz import mutated
from test_ptx_lower import SHAPES, lowered_fast, lowered_reference

from tessera.ptx import lower
from tessera.ptx.body import DECL_NAME, RENAME_TOKEN, apply_renames
from tessera.ptx.parser import SLASHED_STRING, parse_ptx, slashed_string

CORPUS = Path(__file__).parent / "corpus"
TEXTS = [f.read_text() for f in sorted(CORPUS.glob("*/*.ptx"))]
# the patterns as they were before the speed work
OLD_DECL_NAME = re.compile(r"([A-Za-z_$%][\w$]*)\s*(?:<\s*(\d+)\s*>|\[\s*(\d*)\s*\])?\s*(?:=|;|,|$)")
OLD_ARITH = re.compile(r"[ \t]++([A-Za-z_$%][\w$@]*+(?:, (?:[A-Za-z_$%][\w$@]*+|-?\d\w*+))*+);\Z", re.A)
OLD_SPECIAL = re.compile(r"[ \t]++([A-Za-z_$%][\w$@]*+), ([A-Za-z_$%][\w$@]*+)\.\w++;\Z", re.A)
RENAME = {"a": "a@1", "param0": "param0@2", "%x": "%x@3", "b1": "q"}


def _text(alphabet: list[str], max_size: int = 12) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(alphabet), max_size=max_size).map("".join)


@settings(max_examples=3000, deadline=None)
@given(_text(list('ab"/*\n x;'), 30))
def test_slashed_string_check_equals_the_regex(text: str) -> None:
    assert slashed_string(text) == (SLASHED_STRING.search(text) is not None)


@settings(max_examples=3000, deadline=None)
@given(_text(["a", "b1", "%x", "param0", "$", ".", "_", "1", "[", "]", "<", ">", "=", ";", ",", " ", "\t", "\n",
              "@", "+"], 20))
def test_renames_and_declaration_names_equal_the_old_patterns(text: str) -> None:
    assert apply_renames(text, RENAME) == RENAME_TOKEN.sub(lambda m: RENAME.get(m[0], m[0]), text)
    assert DECL_NAME.findall(text) == OLD_DECL_NAME.findall(text)
    new, old = DECL_NAME.match(text), OLD_DECL_NAME.match(text)
    assert (new and new.groups()) == (old and old.groups())


@settings(max_examples=3000, deadline=None)
@given(_text(["%r1", "%rd2", ", ", ",", "%ctaid", ".x", ".y", "16", "-1", "0f3F80", " ", "\t", ";", "|", "$a",
              "_b", "@c", "[", "x"], 8))
def test_arith_or_special_equals_the_two_patterns(ops: str) -> None:
    text = " " + ops  # the lowering matches from the first space on; the combined pattern after it
    m = lower.ARITH_OR_SPECIAL.match(text[1:])
    arith, special = OLD_ARITH.match(text), OLD_SPECIAL.match(text)
    if arith is not None:
        assert m is not None and m[1] == arith[1]
    elif special is not None:
        assert m is not None and m[1] is None and (m[2], m[3]) == special.groups()
    else:
        assert m is None


def _lines(text: str, lowered: bool) -> object:
    """Every function's header line and body offset (the fast path hands the parser the body's newline
    count instead of it counting them again)."""
    try:
        fns = parse_ptx(text, "f.ptx", lower=lower.lower_body if lowered else None).functions.values()
    except ValueError as e:
        return str(e)
    return [(f.name, f.line, f.body_offset, f.defined) for f in fns]


def test_line_numbers_and_results_agree_on_corpus() -> None:
    for text in TEXTS + [SHAPES]:
        assert _lines(text, True) == _lines(text, False)
        assert lowered_fast(text) == lowered_reference(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_line_numbers_and_results_agree_on_mutated_ptx(text: str) -> None:
    assert _lines(text, True) == _lines(text, False)
    assert lowered_fast(text) == lowered_reference(text)
