"""The server's own settings: `tessera serve`'s default model length, worked by hand."""

from __future__ import annotations

from tessera.serve.config import DEFAULT_MODEL_LEN, default_model_len


def test_default_model_len_is_the_context_at_most_2048() -> None:
    assert DEFAULT_MODEL_LEN == 2048
    assert default_model_len(1024) == 1024  # a short context is the limit
    assert default_model_len(131072) == 2048  # a long one is cut to keep the default KV cache small
    assert default_model_len(2048) == 2048
    assert default_model_len(None) == 2048  # no context window (a model without one): the cap alone
