"""The engine's online switch (`serve-run --adaptive`): the policy's decisions on hand-worked queue
sequences, the drain before a switch, the regrouping of running requests, and a short served stream whose
greedy tokens equal a fixed schedule's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tessera.engine.adaptive import AdaptiveSettings, Schedule, Switcher, switcher_for
from tessera.engine.config import EngineConfig, SamplingParams
from tessera.engine.engine import Engine
from tessera.engine.loader import open_model
from tessera.engine.tokenizer import tokenizer_for
from tessera.errors import UserError
from tessera.sim.adaptive import AdaptivePolicy


def driver_engine(m: int = 1) -> Engine:
    source = open_model("llama-tiny")
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, microbatches=m, max_model_len=64)
    return Engine(None, source, config, tokenizer_for(source))


def pool(label: str) -> SimpleNamespace:
    return SimpleNamespace(placement=SimpleNamespace(label=label))


def switcher(engine: Engine, high: int, low: int, latency_pool=None) -> Switcher:
    p = pool("split")
    s = switcher_for(AdaptiveSettings(latency_microbatches=1, high_load=high, low_load=low), engine.config, p,
                     latency_pool)
    s.start(engine)
    return s


def set_load(engine: Engine, n: int) -> None:
    """n requests outstanding, all waiting."""
    engine.scheduler.waiting.clear()
    for _ in range(n):
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))


def test_thresholds_with_hysteresis():
    """high 4, low 2, nothing in flight: loads 1 3 4 5 3 2 1 3 4 give L L T T T L L L T (3 stays T on the way
    down, 3 stays L on the way up)."""
    engine = driver_engine(m=2)
    s = switcher(engine, high=4, low=2)
    assert engine.config.microbatches == 1  # latency mode first
    modes = []
    for i, load in enumerate([1, 3, 4, 5, 3, 2, 1, 3, 4]):
        set_load(engine, load)
        assert s.gate(engine, 0, float(i)) is True
        modes.append(s.mode[0].upper())
    assert "".join(modes) == "LLTTTLLLT"
    assert [(r.to, r.load, r.decided_at_s) for r in s.switches] == [
        ("throughput", 4, 2.0), ("latency", 2, 5.0), ("throughput", 4, 8.0)]
    assert engine.config.microbatches == 2


def test_switch_waits_for_the_iterations_in_flight():
    """Decided at t=1 with 2 iterations in flight, still 1 at t=2, drained at t=3: nothing scheduled before
    t=3; the first new iteration submitted at t=3.5 and back at t=4.25."""
    engine = driver_engine(m=2)
    s = switcher(engine, high=4, low=2)
    set_load(engine, 5)
    assert s.gate(engine, 2, 1.0) is False and s.mode == "latency"
    set_load(engine, 1)  # the decision stands while draining
    assert s.gate(engine, 1, 2.0) is False
    assert s.gate(engine, 0, 3.0) is True and s.mode == "throughput"
    s.submitted(7, 3.5)
    s.submitted(8, 3.6)
    s.completed(8, 4.0)
    s.completed(7, 4.25)
    (r,) = s.switches
    assert (r.drain_s, r.first_s, r.first_done_s) == (2.0, 2.5, 3.25)
    s.finish(10.0)
    assert s.mode_s == {"latency": 1.0, "throughput": 9.0}
    rep = s.report().to_dict()  # the one switch's cost (first_s 2.5) is both median and max; no first_sid
    assert (rep["high_load"], rep["low_load"], rep["switch_s"]) == (4, 2, {"median": 2.5, "max": 2.5})
    assert rep["mode_s"] == {"latency": 1.0, "throughput": 9.0} and "first_sid" not in rep["switches"][0]
    assert (rep["switches"][0]["to"], rep["switches"][0]["load"], rep["switches"][0]["drain_s"]) == \
        ("throughput", 5, 2.0)


def test_running_requests_regrouped_with_their_pages():
    """Three requests admitted in one group (m = 1), then m = 2: dealt out by arrival, pages kept."""
    engine = driver_engine(m=2)
    s = switcher(engine, high=3, low=1)
    set_load(engine, 3)
    # load 3 reaches high: switch now, before anything runs, then back down is not possible while 3 wait
    assert s.gate(engine, 0, 0.0) and engine.config.microbatches == 2
    engine.reconfigure(EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, microbatches=1, max_model_len=64))
    batch = engine.schedule()
    assert [x.request.id for x in batch.scheduled] == [0, 1, 2]
    pages = {r.id: list(r.pages) for r in engine.scheduler.running[0]}
    engine.reconfigure(EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, microbatches=2, max_model_len=64))
    assert [[r.id for r in g] for g in engine.scheduler.running] == [[0, 2], [1]]
    assert {r.id: list(r.pages) for g in engine.scheduler.running for r in g} == pages
    assert [r.group for r in engine.scheduler.running[0]] == [0, 0]


def test_a_placement_change_restarts_the_running_requests():
    engine = driver_engine(m=2)
    s = switcher(engine, high=2, low=0, latency_pool=pool("single"))
    assert engine.placement == "single"
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    engine.schedule()
    assert engine.scheduler.num_running == 1
    engine.add_request([4, 5], SamplingParams(max_tokens=2))
    assert s.gate(engine, 0, 1.0) and s.mode == "throughput" and engine.placement == "split"
    assert s.switches[0].restarted == 1 and engine.scheduler.num_running == 0
    assert len(engine.scheduler.waiting) == 2


def test_settings_mistakes():
    engine = driver_engine(m=1)
    with pytest.raises(UserError, match="both schedules run 1 micro-batch"):
        switcher_for(AdaptiveSettings(latency_microbatches=1), engine.config, pool("x"))
    with pytest.raises(UserError, match="low=4, high=4"):
        AdaptiveSettings(high_load=4, low_load=4).policy(engine.config)
    with pytest.raises(UserError, match="needs high_load"):
        AdaptivePolicy()  # neither a latency plan nor thresholds
    assert AdaptiveSettings().policy(engine.config).high_load == 8  # max_num_seqs, as a latency plan's
    assert AdaptiveSettings().policy(engine.config).low_load == 4
    with pytest.raises(UserError, match="valid latency, throughput"):
        Switcher(AdaptiveSettings().policy(engine.config), {"latency": Schedule(microbatches=1, pool=pool("x"))})


def test_serve_run_adaptive_tokens_equal_fixed(run_cli):
    """12 requests at once on two workers, switching at 3 / 1 outstanding: to m = 2 at the first iteration
    (12 waiting), back to m = 1 when one request is left (the load only falls); every request completes with
    the tokens of the fixed m = 2 run and of the single-process engine."""
    args = ["serve-run", "llama-tiny", "--devices", "cpu,cpu", "--workload", "offline", "--requests", "12",
            "--prompt", "4-10", "--output", "3-8", "--microbatches", "2", "--max-num-batched-tokens", "16",
            "--page-size", "4", "--dtype", "fp32", "--json"]
    code, out, err = run_cli([*args, "--adaptive", "--high-load", "3", "--low-load", "1", "--verify"])
    assert code == 0, err
    got = json.loads(out)
    assert got["completed"] == 12 and got["verified"] is True
    rep = got["extra"]["adaptive"]
    assert rep["microbatches"] == {"latency": 1, "throughput": 2} and rep["high_load"] == 3
    assert [(r["to"], r["load"]) for r in rep["switches"]] == [("throughput", 12), ("latency", 1)]
    assert all(r["first_s"] >= r["drain_s"] >= 0 for r in rep["switches"] if r["first_s"] is not None)
    code, out, err = run_cli(args)
    assert code == 0, err
    assert json.loads(out)["extra"]["tokens"] == got["extra"]["tokens"]


def test_serve_run_adaptive_between_two_placements(run_cli):
    """The latency schedule on another placement (both pools running): to layer_split with m = 2 at the
    first iteration (nothing running yet: nothing restarted), back to interleave with m = 1 when one request
    is left (it recomputes there); every request verified."""
    code, out, err = run_cli(["serve-run", "llama-tiny", "--devices", "cpu,cpu", "--workload", "offline",
                              "--requests", "12", "--prompt", "4-10", "--output", "3-8", "--microbatches", "2",
                              "--max-num-batched-tokens", "16", "--page-size", "4", "--dtype", "fp32",
                              "--placement", "layer_split", "--adaptive", "--latency-placement", "interleave",
                              "--high-load", "3", "--low-load", "1", "--verify", "--json"])
    assert code == 0, err
    got = json.loads(out)
    assert got["completed"] == 12 and got["verified"] is True
    rep = got["extra"]["adaptive"]
    assert rep["placements"] == {"latency": "interleave", "throughput": "layer_split"}
    assert [(r["to"], r["load"]) for r in rep["switches"]] == [("throughput", 12), ("latency", 1)]
    assert rep["switches"][0]["restarted"] == 0 and rep["switches"][1]["restarted"] <= 1
