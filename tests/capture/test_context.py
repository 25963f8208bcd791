"""A request against a model's context window: Llama 3 8B's published config.json gives
max_position_embeddings 8192 (meta-llama/Meta-Llama-3-8B)."""

import pytest

from tessera.capture.context import check_context, max_positions
from tessera.errors import UserError


def test_llama_3_8b_window_is_its_published_8192_positions() -> None:
    assert max_positions("llama-3-8b") == 8192


def test_a_request_that_fills_the_window_exactly_passes() -> None:
    check_context("llama-3-8b", 8000, 192)  # 8000 + 192 = 8192


def test_one_token_over_the_window_is_one_line_naming_the_sum_and_the_window() -> None:
    with pytest.raises(UserError) as e:
        check_context("llama-3-8b", 8000, 193)
    assert str(e.value) == ("prompt 8,000 + output 193 tokens = 8,193 exceed llama-3-8b's context window of "
                            "8,192 tokens; give --prompt and --output that sum to at most 8,192")


def test_a_length_that_is_not_a_number_is_not_checked() -> None:
    check_context("llama-3-8b", None, 10**6)


def test_an_unknown_model_is_refused_unless_known_only() -> None:
    with pytest.raises(UserError):
        check_context("no-such-model", 1, 1)
    check_context("no-such-model", 1, 1, known_only=True)
