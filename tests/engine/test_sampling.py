"""Sampling filters by hand, seeded sampling reproducible whatever the batch, and how requests end:
stop strings, EOS, max tokens, with OpenAI's finish reasons."""

from __future__ import annotations

import math

import torch

from tessera.engine import EngineConfig, SamplingParams, load_engine
from tessera.engine.sampling import filtered_logits

CONFIG = EngineConfig(max_num_seqs=4, max_num_batched_tokens=8, page_size=4, max_model_len=64)


def kept(logits: list[float], **kw) -> list[int]:
    x = filtered_logits(torch.tensor(logits), SamplingParams(temperature=1.0, **kw))
    return [i for i, v in enumerate(x.tolist()) if v != -math.inf]


def test_top_k_and_top_p_by_hand():
    assert kept([1.0, 3.0, 2.0, 0.0], top_k=2) == [1, 2]
    probs = [0.5, 0.3, 0.15, 0.05]
    logits = [math.log(p) for p in probs]
    assert kept(logits, top_p=0.7) == [0, 1]  # 0.5 < 0.7 before the second token, 0.8 >= 0.7 before the third
    assert kept(logits, top_p=0.5) == [0]  # the most probable alone already reaches 0.5
    assert kept(logits, top_p=1.0) == [0, 1, 2, 3]
    t = filtered_logits(torch.tensor([2.0, 4.0]), SamplingParams(temperature=2.0))
    assert t.tolist() == [1.0, 2.0]


def test_seeded_samples_do_not_depend_on_the_batch():
    engine = load_engine("llama-tiny", CONFIG, dtype="fp32", load_format="dummy")
    hot = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    alone = engine.generate([[3, 4, 5]], hot)[0]
    others = [[9] * 11, [30, 31], [50] * 6]
    together = engine.generate([others[0], [3, 4, 5], *others[1:]],
                               [SamplingParams(max_tokens=6, temperature=0.7, seed=1), hot,
                                SamplingParams(max_tokens=3), SamplingParams(max_tokens=5, temperature=1.5)])
    assert together[1].token_ids == alone.token_ids
    other_seed = engine.generate([[3, 4, 5]], SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=8,
                                                             ignore_eos=True))[0]
    assert other_seed.token_ids != alone.token_ids


def test_stop_string_eos_and_length(saved):
    directory, _ = saved("llama")
    engine = load_engine(str(directory), CONFIG, dtype="fp32")
    prompt = engine.codec.encode("w5 w17 w33")
    free = engine.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 6
    words = free.text.split()
    stop = words[2]
    cut = engine.generate([prompt], SamplingParams(max_tokens=6, stop=(stop,), ignore_eos=True))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[:free.text.index(stop)]
    assert cut.token_ids == free.token_ids[:free.token_ids.index(int(stop[1:])) + 1]
    eos = free.token_ids[3]
    engine.codec.eos_token_ids = (eos,)
    ended = engine.generate([prompt], SamplingParams(max_tokens=6))[0]
    first = free.token_ids.index(eos)
    assert ended.finish_reason == "stop" and ended.token_ids == free.token_ids[:first + 1]
    assert ended.text == engine.codec.tok.decode(list(free.token_ids[:first]))
    ignored = engine.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True))[0]
    assert ignored.token_ids == free.token_ids
