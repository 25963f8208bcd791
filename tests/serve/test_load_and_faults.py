"""Under load and faults: bad bodies (400 naming the field, OpenAI's error JSON), 429 at once when the
server holds its limit, a client that goes away frees its pages, /metrics parses, SIGTERM drains the
requests in flight, a worker lost mid-stream costs no token and duplicates none."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tessera.engine.config import EngineConfig, SamplingParams
from tests.serve.conftest import reference, start, wait_until

GOOD = {"model": "tiny", "prompt": "hello", "max_tokens": 4}


@pytest.mark.parametrize("change, param, words", [
    ({"max_tokens": -1}, "max_tokens", "greater than or equal to 1"),
    ({"max_tokens": 300}, "max_tokens", "exceeds the model's 256-token context"),
    ({"temperature": "hot"}, "temperature", "valid number"),
    ({"top_p": 0}, "top_p", "greater than 0"),
    ({"prompt": None}, "prompt", "prompt"),
    ({"prompt": [5, 999]}, "prompt", "outside the vocabulary 0..255"),
    ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
    ({"prompt": ""}, "prompt", "must not be empty"),
    ({"n": 2}, "n", "less than or equal to 1"),
    ({"stop": ["a", ""]}, "stop", "non-empty"),
    ({"presence_penalty": 0.5}, "presence_penalty", "not supported"),
    ({"logprobs": 3}, "logprobs", "not supported"),
    ({"stream": "sometimes"}, "stream", "valid boolean"),
])
def test_bad_body_is_400_naming_the_field(tiny, change, param, words):
    body = {k: v for k, v in (GOOD | change).items() if v is not None}
    r = httpx.post(f"{tiny.url}/v1/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"] and err["type"] == "invalid_request_error"
    assert err["code"] == 400


def test_malformed_json_and_unknown_model(tiny):
    r = httpx.post(f"{tiny.url}/v1/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{tiny.url}/v1/completions", json=GOOD | {"model": "gpt-9"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(f"{tiny.url}/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "cat"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.role"


def metric(running, name: str, labels: dict[str, str] | None = None) -> float:
    """One sample of /metrics, parsed by prometheus_client's own parser."""
    text = httpx.get(f"{running.url}/metrics").text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and (labels is None or all(s.labels.get(k) == v for k, v in labels.items())):
                return s.value
    raise KeyError(name)


@pytest.fixture
def narrow():
    """One request runs at a time and none may wait: the second request is over the limit."""
    running = start("llama-tiny", load_format="dummy", max_waiting=0,
                    config=EngineConfig(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=2048))
    yield running
    running.close()


def test_full_server_answers_429_and_a_gone_client_frees_its_pages(narrow):
    engine = narrow.thread.engine
    pages = engine.scheduler.pages
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{narrow.url}/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # running: a token came
        assert pages.free < pages.count
        c = openai.OpenAI(base_url=f"{narrow.url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.RateLimitError) as e:
            c.completions.create(model="tiny", prompt="x", max_tokens=2)
        assert e.value.status_code == 429 and "limit of 1 requests" in e.value.body["message"]
    # the stream closed after one chunk: the request is aborted, its pages back on the free list
    wait_until(lambda: pages.free == pages.count and not engine.scheduler.has_work(), what="pages freed")
    wait_until(lambda: metric(narrow, "tessera_requests_total", {"finish_reason": "abort"}) == 1,
               what="abort counted")
    assert metric(narrow, "tessera_requests_rejected_total", {"reason": "full"}) == 1
    assert metric(narrow, "tessera_kv_pages_in_use") == 0
    assert len(engine.requests) == 0  # nothing kept of a finished request
    # and the server goes on: the freed slot takes the next request
    got = c.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"ignore_eos": True})
    assert got.usage.completion_tokens == 2


def test_metrics_count_what_was_served(narrow):
    c = openai.OpenAI(base_url=f"{narrow.url}/v1", api_key="unused", max_retries=0)
    for n in (3, 5):
        c.completions.create(model="tiny", prompt="hello", max_tokens=n, extra_body={"ignore_eos": True})
    text = httpx.get(f"{narrow.url}/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("tessera_time_to_first_token_seconds", "tessera_time_per_output_token_seconds",
                 "tessera_e2e_request_latency_seconds", "tessera_num_requests_running",
                 "tessera_num_requests_waiting", "tessera_kv_pages_in_use", "tessera_worker_busy_share",
                 "tessera_generation_tokens", "tessera_prompt_tokens"):
        assert name in fams, name
    assert metric(narrow, "tessera_generation_tokens_total") == 3 + 5
    assert metric(narrow, "tessera_prompt_tokens_total") == 2 * len("hello")
    assert metric(narrow, "tessera_time_to_first_token_seconds_count") == 2
    assert metric(narrow, "tessera_e2e_request_latency_seconds_count") == 2
    assert metric(narrow, "tessera_requests_total", {"finish_reason": "length"}) == 2
    assert metric(narrow, "tessera_worker_busy_seconds_total", {"worker": "0", "device": "cpu"}) > 0


def test_api_key(tmp_path):
    from tessera.engine.engine import load_engine
    from tessera.engine.serve import InProcess
    from tessera.serve.config import ServerConfig
    from tessera.serve.launch import Running

    engine = load_engine("llama-tiny", EngineConfig(max_num_seqs=2, max_model_len=64), dtype="fp32",
                         load_format="dummy")
    running = Running(engine, InProcess(engine), ServerConfig(served_model_name="tiny", port=0, api_key="k1"),
                      quiet=True).start_background()
    try:
        r = httpx.post(f"{running.url}/v1/completions", json=GOOD)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        ok = openai.OpenAI(base_url=f"{running.url}/v1", api_key="k1", max_retries=0)
        assert ok.completions.create(**GOOD).usage.completion_tokens >= 1
        assert httpx.get(f"{running.url}/health").status_code == 200  # probes need no key
    finally:
        running.close()


def stream_ids(url: str, body: dict, after_first=None) -> tuple[list[int], str | None]:
    """A streamed completion's token ids and finish reason; ``after_first`` runs once the first chunk is
    in."""
    ids, reason = [], None
    with httpx.stream("POST", f"{url}/v1/completions", json=body | {"stream": True, "return_token_ids": True},
                      timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            choice = json.loads(line[5:])["choices"][0]
            ids += choice["token_ids"]
            reason = choice["finish_reason"] or reason
            if after_first is not None:
                after_first()
                after_first = None
    return ids, reason


@pytest.mark.slow
def test_sigterm_drains_the_requests_in_flight(subprocess_server):
    server = subprocess_server(["llama-tiny", "--load-format", "dummy", "--dtype", "fp32", "--max-model-len",
                                "256"])
    body = {"model": "llama-tiny", "prompt": [5, 6, 7], "max_tokens": 64, "ignore_eos": True,
            "temperature": 0}
    ids, reason = stream_ids(server.url, body, after_first=lambda: server.proc.send_signal(signal.SIGTERM))
    engine = reference("llama-tiny", "dummy", EngineConfig(max_num_seqs=16, max_num_batched_tokens=256,
                                                           max_model_len=256))
    (ref,) = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=64, ignore_eos=True))
    assert ids == list(ref.token_ids) and reason == "length"
    assert server.proc.wait(60) == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.url}/health", timeout=2)
    assert "draining" in Path(server.log).read_text()


def worker_pids(pid: int) -> list[int]:
    """The engine's worker processes: children of ``pid`` started by multiprocessing's spawn (not its
    resource tracker)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"spawn_main" in cmd:
                out.append(int(child))
    return sorted(out)


@pytest.mark.slow
def test_a_worker_lost_mid_stream_costs_no_token(subprocess_server):
    """Two workers (layer split); four streams; worker 1 SIGKILLed once the first stream has its first
    token: the driver re-places onto worker 0 and every stream ends with exactly the engine's tokens."""
    server = subprocess_server(["llama-tiny", "--load-format", "dummy", "--dtype", "fp32", "--devices",
                                "cpu,cpu", "--max-model-len", "128", "--max-num-seqs", "4"])
    (a, b) = worker_pids(server.proc.pid)
    import concurrent.futures as cf

    prompts = [[5 + i, 6, 7, 8 + i] for i in range(4)]
    bodies = [{"model": "llama-tiny", "prompt": p, "max_tokens": 24, "ignore_eos": True, "temperature": 0}
              for p in prompts]
    kill = lambda: os.kill(b, signal.SIGKILL)  # noqa: E731
    with cf.ThreadPoolExecutor(4) as ex:
        futures = [ex.submit(stream_ids, server.url, body, kill if i == 0 else None)
                   for i, body in enumerate(bodies)]
        got = [f.result() for f in futures]
    engine = reference("llama-tiny", "dummy", EngineConfig(max_num_seqs=4, max_num_batched_tokens=256,
                                                           max_model_len=128))
    want = engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    assert [g[0] for g in got] == [list(w.token_ids) for w in want]
    assert all(g[1] == "length" for g in got)
    text = httpx.get(f"{server.url}/metrics").text
    assert "tessera_worker_recoveries_total 1.0" in text
    assert len(worker_pids(server.proc.pid)) == 1 and a not in worker_pids(server.proc.pid)


@pytest.mark.slow
def test_adaptive_switches_schedules_without_changing_tokens(subprocess_server):
    """--adaptive on two workers: latency schedule (m=1) until more than 2 requests are outstanding, then
    the throughput one (m=2); eight requests at once make it switch, and each gets the engine's tokens."""
    server = subprocess_server(["llama-tiny", "--load-format", "dummy", "--dtype", "fp32", "--devices",
                                "cpu,cpu", "--max-model-len", "64", "--max-num-seqs", "4", "--microbatches",
                                "2", "--adaptive", "--latency-microbatches", "1", "--high-load", "2",
                                "--low-load", "1"])
    import concurrent.futures as cf

    prompts = [[9 + i, 4, 7] for i in range(8)]
    bodies = [{"model": "llama-tiny", "prompt": p, "max_tokens": 12, "ignore_eos": True, "temperature": 0}
              for p in prompts]
    with cf.ThreadPoolExecutor(8) as ex:
        got = list(ex.map(lambda b: stream_ids(server.url, b), bodies))
    engine = reference("llama-tiny", "dummy", EngineConfig(max_num_seqs=4, max_num_batched_tokens=256,
                                                           max_model_len=64))
    want = engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    assert [g[0] for g in got] == [list(w.token_ids) for w in want]
    text = httpx.get(f"{server.url}/metrics").text
    switches = next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                    if s.name == "tessera_adaptive_switches_total")
    assert switches >= 1


def test_a_taken_port_is_one_line_before_loading(run_cli):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, _, err = run_cli(["serve", "llama-tiny", "--load-format", "dummy", "--port", str(port)])
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err and len(err.strip().splitlines()) == 1
