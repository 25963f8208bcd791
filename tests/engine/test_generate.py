"""`tessera generate` and `serve-run` as functions: the prompts' ids, the default model length of each
(hand-worked) and where generate runs; generate's result against the engine run directly."""

from __future__ import annotations

from tessera.engine.config import EngineConfig, SamplingParams
from tessera.engine.devices import parse_devices
from tessera.engine.engine import load_engine
from tessera.engine.generate import (
    GenerateSpec,
    generate,
    in_process,
    longest_request,
    prompt_ids,
)
from tessera.engine.prompts import Prompt
from tessera.engine.serve_run import generated_stream, stream_model_len
from tessera.engine.tokenizer import ByteTokenizer
from tessera.sim.workload import LengthSpec, WorkloadSpec

PROMPTS = (Prompt(text="hi", ids=None, params=SamplingParams(max_tokens=5)),
           Prompt(text=None, ids=(1, 2, 3, 4), params=SamplingParams(max_tokens=2)))


def test_prompt_ids_and_the_longest_request() -> None:
    ids = prompt_ids(PROMPTS, ByteTokenizer())
    assert ids == [[104, 105], [1, 2, 3, 4]]  # "hi" in UTF-8 bytes; ids as given
    assert longest_request(ids, PROMPTS) == 7  # max(2 + 5, 4 + 2)


def test_a_lone_cpu_runs_in_process() -> None:
    assert in_process(parse_devices("cpu"))
    assert not in_process(parse_devices("cpu,cpu"))
    assert not in_process(parse_devices("cpu:threads=2"))  # one worker process, two threads


def test_stream_model_len_is_the_longest_the_ranges_can_draw() -> None:
    w = WorkloadSpec(kind="offline", requests=3, rate_per_s=0.0, prompt=LengthSpec.parse("4-8"),
                     output=LengthSpec.parse("2-6"))
    stream = generated_stream(w, seed=0, vocab=256)
    drawn = max(len(a.prompt_ids) + a.params.max_tokens for a in stream.arrivals)
    assert stream_model_len(stream, generated=True) == 8 + 6  # whatever the seed drew
    assert stream_model_len(stream, generated=False) == drawn <= 14  # a file: its own longest request


def test_generate_equals_the_engine_run_directly() -> None:
    config = EngineConfig(max_num_seqs=2, max_num_batched_tokens=32)
    r = generate(GenerateSpec(model="llama-tiny", prompts=PROMPTS, kinds=parse_devices("cpu"), config=config,
                              load_format="dummy"))
    engine = load_engine("llama-tiny", EngineConfig(max_num_seqs=2, max_num_batched_tokens=32, max_model_len=7),
                         load_format="dummy")
    want = engine.generate([[104, 105], [1, 2, 3, 4]], [p.params for p in PROMPTS])
    assert r.completions == tuple(want) and r.iterations == len(engine.history)
    assert r.tokens == 5 + 2 == sum(len(c.token_ids) for c in want)
    assert r.load_s >= 0 and r.generate_s >= 0
