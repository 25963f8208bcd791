"""Serving a request stream on two CPU workers: every request's tokens and logits equal the request run
alone in one process, whatever shared its iterations; slots are freed and reused; iterations mix prefill
and decode; bad input is one line."""

from __future__ import annotations

import json

import pytest

from tessera.runtime.placements import placements
from tessera.runtime.serving import (
    ServeConfig,
    by_key,
    capture_serving,
    check,
    group_graphs,
    make_requests,
    reference,
    serve_stream,
    serving_keys,
    start_cluster,
    utilisation,
)
from tessera.runtime.worker import StepCmd
from tessera.sim.workload import LengthSpec, WorkloadSpec, generate

pytestmark = pytest.mark.slow


def stream(model: str, n: int, *, kind: str = "offline", prompt: str = "3-5", output: str = "2-4"):
    w = WorkloadSpec(kind=kind, requests=n, rate_per_s=200.0 if kind != "offline" else 0.0,
                     prompt=LengthSpec.parse(prompt), output=LengthSpec.parse(output))
    return make_requests(model, generate(w, seed=3), seed=3)


def test_llama_slots_reused_iterations_mixed_async_and_sync_exact() -> None:
    reqs = stream("llama-tiny", 5)
    progs = capture_serving("llama-tiny", serving_keys(reqs))
    by_phase = by_key(progs, placements("layer_split", group_graphs(progs), 2))
    ref = reference(progs, reqs)
    with start_cluster(progs, by_phase, ("cpu", "cpu"), slots=2) as cluster:
        sync = serve_stream(cluster, progs, reqs, ServeConfig(slots=2, microbatches=1, schedule="sync",
                                                              prefills_per_iteration=1))
        free = serve_stream(cluster, progs, reqs, ServeConfig(slots=2, microbatches=1, schedule="sync"))
        asyn = serve_stream(cluster, progs, reqs, ServeConfig(slots=2, microbatches=2, schedule="async"))
    for res in (sync, free, asyn):
        assert check(res, ref) == (True, 0.0, True)
        assert [len(s.tokens) for s in res.served] == [r.output_tokens for r in reqs]
        assert {s.slot for s in res.served} <= {0, 1}  # 5 requests through 2 slots: freed and reused
    # sync, one group of 2 slots, one new prompt per iteration, all 5 requests waiting at t=0:
    # iteration 0 prefills request 0 alone; iteration 1 decodes request 0 beside request 1's prefill
    p0, p1 = (r.prompt.shape[1] for r in reqs[:2])
    assert sync.history[0]["keys"] == [f"prefill@{p0}"]
    assert sync.history[1]["keys"] == [f"decode@{p0}", f"prefill@{p1}"]
    # no limit (the default): both free slots admit at once, and every iteration holds both slots until
    # the queue runs dry (5 requests of >= 2 steps: at least 4 full iterations before the last admission)
    assert free.history[0]["keys"] == [f"prefill@{p0}", f"prefill@{p1}"]
    assert all(len(h["keys"]) == 2 for h in free.history[:4])
    # async: two groups of one slot each, so no iteration holds two requests
    assert all(len(h["keys"]) == 1 for h in asyn.history)
    for res in (sync, asyn):  # shares of the stream's wall time: kernels and waits lie inside the steps
        u = utilisation(res)
        for w in u["workers"]:
            assert 0 < w["kernels"] + w["waits"] <= w["busy"] <= 1.0 + 1e-9
            assert w["steps"] == res.iterations and w["cpu"] is not None and w["cpu"] >= 0
        assert u["driver_cpu"] >= 0


def test_async_groups_interleave_on_a_worker_and_stay_exact() -> None:
    # attention and GEMMs on different workers: every step crosses between them several times, so a
    # worker's step for one group keeps waiting on the other worker; the worker runs the other group's
    # step meanwhile (its kernels fall inside the first step's span) and every token stays exact
    reqs = stream("llama-tiny", 6)
    progs = capture_serving("llama-tiny", serving_keys(reqs))
    assign = by_key(progs, placements("attention_gemm", group_graphs(progs), 2))
    with start_cluster(progs, assign, ("cpu", "cpu"), slots=2) as cluster:
        res = serve_stream(cluster, progs, reqs, ServeConfig(slots=2, microbatches=2))
    assert check(res, reference(progs, reqs)) == (True, 0.0, True)
    inside = sum(1 for d in range(2) for h in res.history for o in res.history if o["group"] != h["group"]
                 for _, _, a, b in o["workers"][d]["kernels"]
                 if h["workers"][d]["start_s"] < a and b < h["workers"][d]["end_s"])
    assert inside > 0


def test_programs_share_one_copy_of_each_weight() -> None:
    progs = capture_serving("llama-tiny", ["prefill@3", "decode@3", "decode@4"])
    weights = [{p.name(b): t for b, t in p.initial.items() if p.graph.buffers[b].role.name == "WEIGHT"}
               for p in progs.values()]
    assert weights[0] and weights[0].keys() == weights[1].keys() == weights[2].keys()
    assert all(w[n] is weights[0][n] for w in weights[1:] for n in weights[0])  # the same tensor, not a copy


@pytest.mark.parametrize("model", ["moe-tiny", "mamba2-tiny"])
def test_moe_and_mamba_streams_exact(model: str) -> None:
    reqs = stream(model, 4, kind="poisson")
    progs = capture_serving(model, serving_keys(reqs))
    by_phase = by_key(progs, placements("layer_split", group_graphs(progs), 2))
    with start_cluster(progs, by_phase, ("cpu", "cpu"), slots=4) as cluster:
        res = serve_stream(cluster, progs, reqs, ServeConfig(slots=4, microbatches=2))
    assert check(res, reference(progs, reqs)) == (True, 0.0, True)


def test_cli_json_contract_and_traces(run_cli, tmp_path) -> None:
    trace = tmp_path / "serve.json"
    code, out, err = run_cli(["serve-run", "llama-tiny", "--requests", "3", "--rate", "100", "--prompt", "3-4",
                              "--output", "2-3", "--slots", "2", "--compare-sync", "--verify", "--json",
                              "--trace", str(trace)])
    assert code == 0, err
    got = json.loads(out)
    for key in ("requests", "completed", "lost", "verified", "tokens_identical", "max_abs_diff", "schedule",
                "measured_throughput_tokens_per_s", "predicted_throughput_tokens_per_s",
                "simulated_throughput_tokens_per_s", "sync_throughput_tokens_per_s"):
        assert key in got
    assert (got["requests"], got["completed"], got["lost"]) == (3, 3, 0)
    assert got["verified"] and got["tokens_identical"] and got["max_abs_diff"] == 0.0
    assert got["schedule"] == "async" and got["sync_throughput_tokens_per_s"] > 0
    assert set(got["ttft_s"]) == set(got["tpot_s"]) == {"p50", "p99"}
    ratio = got["extra"]["async_over_sync"]  # one repeat: its pair, and no spread to bound it with
    assert ratio["pairs"] == [pytest.approx(got["measured_throughput_tokens_per_s"]
                                            / got["sync_throughput_tokens_per_s"])]
    assert ratio["geomean"] == pytest.approx(ratio["pairs"][0]) and ratio["lower"] is None
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["tid"] for e in events if e["ph"] == "X" and e["pid"] == 1} == {0, 1}  # a track per worker
    assert any(e["ph"] == "X" and e["pid"] == 2 for e in events)  # transfers on the link track
    assert (tmp_path / "serve.sim.json").exists()  # the simulator's trace beside it


@pytest.mark.parametrize(("argv", "needle"), [
    (["--schedule", "lockstep"], "lockstep"),
    (["--devices", "cuda:0,cuda:1"], "valid here: cpu"),
    (["--devices", "tpu,cpu"], "valid: cpu, cuda, cuda:N"),
    (["--slots", "1", "--microbatches", "2"], "microbatches (2) <= slots (1)"),
    (["--workload", "steady"], "steady"),
])
def test_bad_input_is_one_line_exit_2(run_cli, argv: list[str], needle: str) -> None:
    code, out, err = run_cli(["serve-run", "llama-tiny", *argv])
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1


def test_step_cmd_checks_per_microbatch_lengths() -> None:
    with pytest.raises(ValueError, match="keys has 1 entries for 2 micro-batches"):
        StepCmd(step_id=0, key="a", plan="p", inputs=({}, {}), reset=False, keys=("a",))


def test_killed_worker_mid_stream_recovered_nothing_lost_tokens_identical(run_cli) -> None:
    code, out, err = run_cli(["serve-run", "llama-tiny", "--requests", "6", "--rate", "100", "--prompt", "3-4",
                              "--output", "3-4", "--slots", "4", "--recover", "--kill-at", "3", "--json"])
    assert code == 0, err
    got = json.loads(out)
    assert (got["completed"], got["lost"]) == (6, 0)
    assert got["verified"] and got["tokens_identical"]  # replayed steps too: bit-identical logits
    (rec,) = got["extra"]["recoveries"]
    assert rec["rank"] == 1 and "SIGKILL" in rec["failure"]
    assert rec["detection_s"] is not None and rec["detection_s"] >= 0


def test_killed_worker_without_recover_is_named_exit_1(run_cli) -> None:
    code, _, err = run_cli(["serve-run", "llama-tiny", "--requests", "4", "--rate", "100", "--prompt", "3",
                            "--output", "3", "--kill-at", "1"])
    assert code == 1
    assert "worker 1" in err and "SIGKILL" in err
