"""Exact stand-ins added for speed, each against what it replaced: the str-method rewrites and
tightened patterns agree with the original patterns on random text."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.ptx.body import DECL_NAME, RENAME_TOKEN, apply_renames
from tessera.ptx.parser import SLASHED_STRING, slashed_string

# the patterns as they were before the speed work
OLD_DECL_NAME = re.compile(r"([A-Za-z_$%][\w$]*)\s*(?:<\s*(\d+)\s*>|\[\s*(\d*)\s*\])?\s*(?:=|;|,|$)")
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
