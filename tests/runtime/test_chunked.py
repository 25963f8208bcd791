"""Chunked prefill across iterations: a prompt longer than the chunk goes in over several iterations, each a
prefill of tokens [a, b) against the cached prefix [0, a), interleaved with other requests' decodes."""

from __future__ import annotations

import pytest
import torch

from tessera.runtime.placements import placements
from tessera.runtime.serving import (
    Request,
    ServeConfig,
    by_key,
    capture_serving,
    check,
    group_graphs,
    key_tokens,
    make_requests,
    reference,
    serve_stream,
    serving_keys,
    start_cluster,
)
from tessera.sim.workload import LengthSpec, WorkloadSpec, generate


def req(prompt: int, output: int, chunk: int) -> Request:
    return Request(rid=0, arrival_s=0.0, prompt=torch.arange(prompt).reshape(1, -1), output_tokens=output,
                   chunk_tokens=chunk)


def test_a_ten_token_prompt_in_chunks_of_four_by_hand() -> None:
    r = req(10, 3, 4)
    # [0, 4) into an empty cache, [4, 8) after 4 tokens, [8, 10) after 8: the last chunk gives token 0,
    # then two decodes (one token against 10 and 11 cached tokens): 3 + 3 - 1 = 5 steps
    assert (r.chunks, r.steps) == (3, 5)
    assert [r.span(i) for i in range(3)] == [(0, 4), (4, 8), (8, 10)]
    assert [r.key(i) for i in range(5)] == ["prefill@4", "chunk@4:4", "chunk@8:2", "decode@10", "decode@11"]
    assert [r.token_of(i) for i in range(5)] == [None, None, 0, 1, 2]
    assert [key_tokens(r.key(i)) for i in range(5)] == [(0, 4), (4, 4), (8, 2), (10, 1), (11, 1)]


def test_whole_prompt_and_a_chunk_as_long_as_the_prompt_are_one_step() -> None:
    for chunk in (0, 10, 16):
        r = req(10, 2, chunk)
        assert (r.chunks, r.steps, r.key(0), r.key(1)) == (1, 2, "prefill@10", "decode@10")


def requests(model: str, n: int, chunk: int, kind: str = "offline") -> list[Request]:
    w = WorkloadSpec(kind=kind, requests=n, rate_per_s=200.0 if kind != "offline" else 0.0,
                     prompt=LengthSpec.parse("7-10"), output=LengthSpec.parse("2-4"))
    return make_requests(model, generate(w, seed=5), seed=5, chunk_tokens=chunk)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama-tiny", "mamba2-tiny"])
def test_chunked_prefill_gives_the_whole_prompts_tokens(model: str) -> None:
    """The offset capture is the model's own continuation: prefilling in chunks of 3 gives the same greedy
    tokens as the prompt in one piece, logits equal up to float rounding (MoE is left out: the capture
    routes tokens to experts by their position in the step, so a chunk sees another routing by design)."""
    whole, chunked = requests(model, 3, 0), requests(model, 3, 3)
    progs = capture_serving(model, sorted({*serving_keys(whole), *serving_keys(chunked)}))
    a, b = reference(progs, whole), reference(progs, chunked)
    for r in whole:
        assert a[r.rid][0] == b[r.rid][0]
        for x, y in zip(a[r.rid][1], b[r.rid][1], strict=True):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama-tiny", "moe-tiny", "mamba2-tiny"])
def test_stream_with_chunks_interleaved_with_decodes_is_exact(model: str) -> None:
    reqs = requests(model, 4, 3)
    progs = capture_serving(model, serving_keys(reqs))
    assign = by_key(progs, placements("layer_split", group_graphs(progs), 2))
    ref = reference(progs, reqs)
    with start_cluster(progs, assign, ("cpu", "cpu"), slots=2) as cluster:
        sync = serve_stream(cluster, progs, reqs, ServeConfig(slots=2, microbatches=1, schedule="sync",
                                                              chunk_tokens=3, prefills_per_iteration=1))
        asyn = serve_stream(cluster, progs, reqs, ServeConfig(slots=2, microbatches=2, chunk_tokens=3))
    for res in (sync, asyn):
        assert check(res, ref) == (True, 0.0, True)
        assert [len(s.tokens) for s in res.served] == [r.output_tokens for r in reqs]
    # sync, one group of 2 slots, one prompt in its chunks at a time, all waiting at t=0: request 0's
    # 3 (7-9 tokens) or 4 (10) chunks run alone; request 1's chunks then run beside request 0's decodes
    r0, r1 = reqs[0], reqs[1]
    assert r0.output_tokens >= 3 and r1.chunks >= 3  # the seeded lengths: two decodes, chunks at offsets
    keys = [h["keys"] for h in sync.history]
    assert keys[:r0.chunks] == [[r0.key(i)] for i in range(r0.chunks)]
    assert keys[r0.chunks] == [r0.key(r0.chunks), r1.key(0)]  # a decode beside a first chunk
    assert keys[r0.chunks + 1] == [r0.key(r0.chunks + 1), r1.key(1)]  # beside a chunk at an offset
    assert r1.key(1).startswith("chunk@3:")
