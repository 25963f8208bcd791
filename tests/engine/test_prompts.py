"""The prompts `tessera generate` is given one of three ways, as Prompt values."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.engine.config import SamplingParams
from tessera.engine.prompts import Prompt, prompts_of
from tessera.errors import UserError

DEFAULTS = SamplingParams(max_tokens=5)


def test_text_ids_and_a_file_each_give_their_prompts(tmp_path: Path) -> None:
    assert prompts_of(text="hi", defaults=DEFAULTS) == [Prompt(text="hi", ids=None, params=DEFAULTS)]
    assert prompts_of(ids="1, 2,3", defaults=DEFAULTS) == [Prompt(text=None, ids=(1, 2, 3), params=DEFAULTS)]
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n\n{"prompt_ids": [7, 8], "max_tokens": 2}\n')
    got = prompts_of(file=f, defaults=DEFAULTS)
    assert [(p.text, p.ids, p.params.max_tokens) for p in got] == [("a", None, 5), (None, (7, 8), 2)]


def test_ids_that_are_not_integers_are_one_line_naming_the_flag() -> None:
    with pytest.raises(UserError, match=r"--prompt-ids: '1,x' is not a comma-separated list of token ids"):
        prompts_of(ids="1,x", defaults=DEFAULTS)
