"""`tessera serve-run` and `tessera generate --devices A,B` on the engine's workers: JSON contract, tokens
equal to the single-process engine, a workload file, a worker killed mid-stream, and every mistake (memory
for every family, lengths beyond the context, bad devices) one line with exit status 2 before any worker
starts."""

from __future__ import annotations

import json

import numpy as np
import pytest

RESULT_KEYS = {"model", "devices", "placement", "requests", "completed", "lost", "verified",
               "throughput_tokens_per_s", "ttft_s", "tpot_s", "host_ms_per_iteration",
               "predicted_throughput_tokens_per_s", "simulated_throughput_tokens_per_s", "extra"}


def test_generate_on_two_workers_equals_one(run_cli):
    args = ["generate", "llama-tiny", "--prompt-ids", "5,6,7,8", "--max-tokens", "6", "--ignore-eos",
            "--load-format", "dummy", "--dtype", "fp32", "--json"]
    code, one, err = run_cli(args)
    assert code == 0, err
    code, two, err = run_cli([*args, "--devices", "cpu,cpu", "--placement", "interleave"])
    assert code == 0, err
    a, b = json.loads(one), json.loads(two)
    assert a["token_ids"] == b["token_ids"] and len(b["token_ids"]) == 6
    assert b["devices"] == ["cpu", "cpu"] and b["placement"] == "interleave"


def test_serve_run_stream_with_a_lost_worker(run_cli):
    """16 Poisson arrivals on two workers, worker 1 SIGKILLed when request 4 is first scheduled: re-placed
    onto worker 0, all 16 complete with the single-process engine's tokens."""
    code, out, err = run_cli(["serve-run", "llama-tiny", "--devices", "cpu,cpu", "--requests", "16", "--rate",
                              "100", "--prompt", "4-12", "--output", "3-8", "--microbatches", "2",
                              "--max-num-batched-tokens", "16", "--page-size", "4", "--verify", "--recover",
                              "--kill-at", "4", "--json"])
    assert code == 0, err
    got = json.loads(out)
    assert set(got) == RESULT_KEYS
    assert got["requests"] == got["completed"] == 16 and got["lost"] == 0 and got["verified"] is True
    (event,) = got["extra"]["recoveries"]
    assert "worker 1" in event and "killed by SIGKILL" in event
    assert got["ttft_s"]["p50"] <= got["ttft_s"]["p99"] and got["tpot_s"]["p50"] <= got["tpot_s"]["p99"]
    assert got["extra"]["iterations"] == len(got["extra"]["tokens"]) or got["extra"]["iterations"] > 16


def test_serve_run_workload_file(run_cli, tmp_path):
    rng = np.random.default_rng(3)
    reqs = [{"id": i, "arrival_s": 0.01 * i, "prompt_len": n, "output_len": 4,
             "prompt_ids": rng.integers(0, 256, n).tolist()} for i, n in enumerate([3, 9, 5])]
    f = tmp_path / "w.json"
    generator = {"kind": "poisson", "rate_per_s": 100, "requests": 3, "prompt": "3-9", "output": "4", "seed": 0}
    f.write_text(json.dumps({"generator": generator, "requests": reqs}))
    code, out, err = run_cli(["serve-run", "llama-tiny", "--devices", "cpu", "--workload-file", str(f),
                              "--json", "--verify"])
    assert code == 0, err
    got = json.loads(out)
    assert got["completed"] == 3 and got["verified"] is True
    assert [len(t) for t in got["extra"]["tokens"].values()] == [4, 4, 4]


@pytest.mark.parametrize("args, message", [
    (["mixtral-8x7b"], "mixtral-8x7b needs"),  # the MoE family: weights counted on the meta device
    (["llama-3-70b", "--devices", "cpu,cpu:speed=0.5"], "llama-3-70b needs"),
    (["llama-tiny", "--prompt", "5000"], "exceeds the 4096-token context"),
    (["llama-tiny", "--prompt", "100000", "--output", "1"], "exceeds the 4096-token context"),
    (["llama-tiny", "--devices", "cuda:0"], "does not exist here"),
    (["llama-tiny", "--kill-at", "3", "--kill-rank", "5"], "--kill-rank 5: valid 0..1"),
    (["llama-tiny", "--placement", "diagonal"], "unknown placement 'diagonal'"),
    (["llama-tiny", "--workload", "steady"], "unknown workload 'steady'"),
    (["llama-tiny", "--workload-file", "/nonexistent.json"], "cannot read workload file"),
])
def test_mistakes_are_one_line(run_cli, args, message):
    code, _, err = run_cli(["serve-run", *args])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_memory_checked_for_every_family(run_cli, monkeypatch):
    """With 10 kB available every family is refused before any worker starts, with its figures."""
    monkeypatch.setattr("tessera.engine.serve_run.available_bytes", lambda: 10**4)
    for model in ("llama-tiny", "moe-tiny", "mamba2-tiny"):
        code, _, err = run_cli(["serve-run", model])
        assert code == 2 and f"{model} needs" in err and "MB" not in err and "weights" in err, err
