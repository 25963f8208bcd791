"""Greedy outputs token-identical to transformers' generate() on the same saved weights, for every family:
text through the saved tokenizer, several prompts served together with a token budget small enough that
prompts are chunked across iterations and decodes share iterations with chunks."""

from __future__ import annotations

import pytest
import torch

from tessera.engine import EngineConfig, SamplingParams, load_engine
from tests.engine.conftest import texts

NEW = 8


def reference(hf, ids: list[int]) -> list[int]:
    """transformers' greedy continuation of one prompt (batch 1: no padding), EOS included if reached."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False)
    return out[0, len(ids):].tolist()


def served(engine, prompts: list[str]):
    ids = [engine.codec.encode(t) for t in prompts]
    return ids, engine.generate(ids, SamplingParams(max_tokens=NEW))


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "mamba2"])
def test_greedy_equals_transformers(saved, family):
    directory, hf = saved(family)
    engine = load_engine(str(directory), EngineConfig(max_num_seqs=4, max_num_batched_tokens=6, page_size=4,
                                                      max_model_len=64), dtype="fp32")
    ids, outs = served(engine, texts([3, 11, 17, 1, 8]))
    for prompt, out in zip(ids, outs, strict=True):
        ref = reference(hf, prompt)
        assert list(out.token_ids) == ref
        assert out.text == engine.codec.tok.decode(ref, skip_special_tokens=True)
        assert out.finish_reason == ("stop" if ref[-1] == 2 else "length")
    counts: dict[int, list[int]] = {}
    for it in engine.history:
        for rid, n in it.tokens:
            counts.setdefault(rid, []).append(n)
    assert any(sum(n > 1 for n in ns) >= 2 for ns in counts.values()), "no prompt was chunked"
    mixed = any({1} < {n for _, n in it.tokens} for it in engine.history)
    assert mixed, "no decode shared an iteration with a chunk"
    assert all(sum(n for _, n in it.tokens) <= 6 for it in engine.history)


def test_preemption_and_groups_keep_outputs(saved):
    """Six KV pages of 4 tokens for prompts that need up to 6 each, in two groups taking turns: requests are
    preempted (recomputed later) and the outputs still equal transformers'."""
    directory, hf = saved("llama")
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=6, page_size=4, num_pages=6,
                          max_model_len=64, microbatches=2)
    engine = load_engine(str(directory), config, dtype="fp32")
    ids, outs = served(engine, texts([3, 9, 12, 5], seed=2))
    assert engine.scheduler.preempted > 0
    assert {it.group for it in engine.history} == {0, 1}
    for prompt, out in zip(ids, outs, strict=True):
        assert list(out.token_ids) == reference(hf, prompt)
    assert engine.scheduler.pages.free == 6  # every page back on the free list
