"""plan_graphs end to end on synthetic graphs: Tessera >= every applicable baseline, contract, Plan file."""

from __future__ import annotations

from functools import cache

import pytest

from tessera.errors import UserError
from tessera.graph import KernelGraph
from tessera.plan.planner import STRATEGIES, plan_graphs
from tessera.plan.pool import Pool, Workload
from tessera.plan.synthetic import SynthConfig, llama_like
from tessera.plan.types import Plan

CFG = SynthConfig(layers=4, hidden=1024, ffn=3584, heads=16, kv_heads=4, vocab=8000)
SSM = SynthConfig(layers=4, hidden=1024, ffn=3584, vocab=8000, ssm=True)
W = Workload(batch=8, prompt=256, output=64)


def _source(cfg: SynthConfig):
    @cache
    def src(phase: str, batch: int, seq: int, context: int) -> KernelGraph:
        return llama_like(phase, batch=batch, seq=max(1, seq), context=max(1, context), cfg=cfg)
    return src


@pytest.fixture(scope="module")
def llm_result():
    return plan_graphs("synth", ["prefill", "decode"], _source(CFG), Pool.parse("H100,L40S", "pcie5"),
                       workload=W, points=False)


def test_tessera_at_least_every_applicable_baseline(llm_result) -> None:
    t = llm_result.strategies["tessera"]
    assert t.feasible
    for name in STRATEGIES[1:]:
        o = llm_result.strategies[name]
        assert o.applicable, name
        if o.feasible:
            assert t.throughput >= o.throughput * (1 - 1e-9), name


def test_json_contract_keys(llm_result) -> None:
    j = llm_result.to_json()
    assert set(j) == {"model", "gpus", "mode", "solve_s", "bound_ratio", "strategies"}
    assert list(j["strategies"]) == list(STRATEGIES)
    for ent in j["strategies"].values():
        assert set(ent) == {"applicable", "reason", "feasible", "throughput_tokens_per_s", "usd_per_hour",
                            "usd_per_million_tokens", "latency_s", "memory_bytes"}
    assert j["strategies"]["tessera"]["usd_per_hour"] == pytest.approx(2.99 + 1.10, abs=1.0)
    assert 0 < j["bound_ratio"] <= 1


def test_plan_file_round_trip(llm_result, tmp_path) -> None:
    p = llm_result.tessera
    p.save(tmp_path / "plan.json")
    q = Plan.load(tmp_path / "plan.json")
    assert q == p and q.phases["decode"].assignment == p.phases["decode"].assignment
    assert set(p.phases) == {"prefill", "decode"}
    assert p.kv_bytes_per_token == 4 * 2 * 4 * 64 * 2  # layers x (k,v) x kv_heads x head_dim x bf16


def test_ssm_has_no_attention_ffn_baseline() -> None:
    r = plan_graphs("ssm", ["prefill", "decode"], _source(SSM), Pool.parse("H100,L40S", "pcie5"), workload=W,
                    points=False)
    af = r.strategies["attention_ffn"]
    assert not af.applicable and "attention" in (af.reason or "")
    assert r.strategies["tessera"].feasible


def test_single_phase_has_no_prefill_decode_baseline() -> None:
    r = plan_graphs("synth", ["decode"], _source(CFG), Pool.parse("H100,L40S", "pcie5"), workload=W,
                    points=False)
    assert not r.strategies["prefill_decode"].applicable


def test_infeasible_pool_says_by_how_much() -> None:
    big = SynthConfig(layers=40, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=32000)  # ~85 GB
    with pytest.raises(UserError, match=r"GB short"):
        plan_graphs("big", ["decode"], _source(big), Pool.parse("L40S", "pcie5"), workload=W, points=False)


def test_bad_mode_is_user_error() -> None:
    with pytest.raises(UserError, match="valid: latency, throughput"):
        plan_graphs("synth", ["decode"], _source(CFG), Pool.parse("H100,L40S", "pcie5"), mode="fast")
