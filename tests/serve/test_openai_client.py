"""The server driven by the official `openai` client: completions and chat, streamed and whole, usage
counts, 32 concurrent streams; greedy token ids and text equal to the engine called directly."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.serve.conftest import reference

PROMPTS = ["Once upon a time", "The quick brown fox", "hi", "A longer prompt, of several words, to chunk"]


def client(running) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def want():
    """llama-tiny's greedy completions of PROMPTS, 8 tokens each, EOS ignored, from Engine.generate."""
    from tessera.engine.config import SamplingParams

    engine = reference("llama-tiny", "dummy")
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    return engine.generate([engine.codec.encode(p) for p in PROMPTS], params)


def test_completion_equals_the_engine(tiny, want):
    c = client(tiny)
    for prompt, ref in zip(PROMPTS, want, strict=True):
        got = c.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0,
                                   extra_body={"ignore_eos": True, "return_token_ids": True})
        (choice,) = got.choices
        assert choice.to_dict()["token_ids"] == list(ref.token_ids)
        assert choice.text == ref.text and choice.finish_reason == "length"
        # usage: the prompt's byte tokens (llama-tiny has no tokenizer: one id per UTF-8 byte) and 8 out
        assert got.usage.prompt_tokens == len(prompt.encode()) and got.usage.completion_tokens == 8
        assert got.usage.total_tokens == len(prompt.encode()) + 8


def test_streamed_completion_equals_the_whole(tiny, want):
    c = client(tiny)
    stream = c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=0, stream=True,
                                  stream_options={"include_usage": True},
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    chunks = list(stream)
    *tokens, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 8
    assert "".join(ch.choices[0].text for ch in tokens) == want[0].text
    assert [t for ch in tokens for t in ch.choices[0].to_dict()["token_ids"]] == list(want[0].token_ids)
    assert [ch.choices[0].finish_reason for ch in tokens][-1] == "length"


def test_prompt_as_token_ids(tiny):
    ids = [5, 6, 7, 8]
    engine = reference("llama-tiny", "dummy")
    from tessera.engine.config import SamplingParams

    (ref,) = engine.generate([ids], SamplingParams(max_tokens=6, ignore_eos=True))
    got = client(tiny).completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})
    assert got.choices[0].to_dict()["token_ids"] == list(ref.token_ids)
    assert got.usage.prompt_tokens == 4


def test_32_concurrent_streams(tiny):
    """32 streams at once (more than max_num_seqs=8 run; the rest wait): each stream's tokens are the
    engine's for its prompt."""
    from tessera.engine.config import SamplingParams

    prompts = [f"request number {i}: " + "x" * (i % 7) for i in range(32)]
    engine = reference("llama-tiny", "dummy")
    want = engine.generate([engine.codec.encode(p) for p in prompts],
                           SamplingParams(max_tokens=6, ignore_eos=True))

    async def one(ac: openai.AsyncOpenAI, prompt: str) -> tuple[list[int], str, int]:
        stream = await ac.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True, "return_token_ids": True})
        ids, text, used = [], "", -1
        async for ch in stream:
            if ch.choices:
                ids += ch.choices[0].to_dict()["token_ids"]
                text += ch.choices[0].text
            else:
                used = ch.usage.completion_tokens
        return ids, text, used

    async def all_of() -> list[tuple[list[int], str, int]]:
        async with openai.AsyncOpenAI(base_url=f"{tiny.url}/v1", api_key="unused", max_retries=0) as ac:
            return await asyncio.gather(*(one(ac, p) for p in prompts))

    got = asyncio.run(all_of())
    assert [g[0] for g in got] == [list(w.token_ids) for w in want]
    assert [g[1] for g in got] == [w.text for w in want]
    assert {g[2] for g in got} == {6}


def test_models_lists_the_served_name(tiny):
    (m,) = client(tiny).models.list().data
    assert m.id == "tiny" and m.owned_by == "tessera"


def test_chat_through_the_template(chat, chat_dir):
    """The chat template renders [system w10, user w11 w12] as "w4 w10 w5 w11 w12 w7" (no BOS: the template
    has none); the answer is the engine's greedy continuation of exactly those ids, EOS stops it."""
    from tessera.engine.config import SamplingParams

    messages = [{"role": "system", "content": "w10"}, {"role": "user", "content": "w11 w12"}]
    engine = reference(str(chat_dir), "auto")
    (ref,) = engine.generate([[4, 10, 5, 11, 12, 7]], SamplingParams(max_tokens=12))
    c = client(chat)
    got = c.chat.completions.create(model="chat", messages=messages, max_tokens=12, temperature=0,
                                    extra_body={"return_token_ids": True})
    assert got.to_dict()["prompt_token_ids"] == [4, 10, 5, 11, 12, 7]
    (choice,) = got.choices
    assert choice.message.role == "assistant" and choice.message.content == ref.text
    assert choice.to_dict()["token_ids"] == list(ref.token_ids) and choice.finish_reason == ref.finish_reason
    assert got.usage.prompt_tokens == 6 and got.usage.completion_tokens == len(ref.token_ids)
    stream = list(c.chat.completions.create(model="chat", messages=messages, max_tokens=12, temperature=0,
                                            stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in stream) == ref.text
    assert stream[-1].choices[0].finish_reason == ref.finish_reason


def test_chat_without_a_template_is_400(tiny):
    with pytest.raises(openai.BadRequestError) as e:
        client(tiny).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 400 and e.value.body["param"] == "messages"
    assert "no chat template" in e.value.body["message"]


def test_stop_string_cuts_the_text(chat, chat_dir):
    """A stop string: the text ends before it, in the whole answer and in the concatenated stream."""
    from tessera.engine.config import SamplingParams

    engine = reference(str(chat_dir), "auto")
    (free,) = engine.generate([[1, 20, 21]], SamplingParams(max_tokens=10, ignore_eos=True))
    words = free.text.split()
    stop = words[2]  # the third generated word: the text is cut right before its first occurrence
    want = free.text[:free.text.index(stop)]
    c = client(chat)
    got = c.completions.create(model="chat", prompt="w20 w21", max_tokens=10, temperature=0, stop=[stop],
                               extra_body={"ignore_eos": True})
    assert got.choices[0].text == want and got.choices[0].finish_reason == "stop"
    chunks = list(c.completions.create(model="chat", prompt="w20 w21", max_tokens=10, temperature=0,
                                       stop=stop, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(ch.choices[0].text for ch in chunks) == want
