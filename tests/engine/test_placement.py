"""Placements of the engine's program over worker kinds: the profile fit and cost model by hand, the
planner over a fast and a half-speed worker (profiles given by hand, so nothing is timed), its Plan file
read back node for node and served by the simulator, and a capture-made plan carried over by module."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tessera.engine.config import EngineConfig
from tessera.engine.devices import WorkerKind
from tessera.engine.inputs import IterationShape
from tessera.engine.kernels import kernel_graph
from tessera.engine.loader import open_model
from tessera.engine.placement import by_module, from_file, plan_engine, unit_of
from tessera.engine.profile import KindProfile, ProfileCost, fit, node_class
from tessera.graph import KernelKind
from tessera.hardware import LinkSpec
from tessera.plan import Traffic

FAST, SLOW = WorkerKind(device="cpu"), WorkerKind(device="cpu", speed=0.5)
CONFIG = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, page_size=16, max_model_len=256,
                      microbatches=2)
LINK = LinkSpec(name="test-link", bytes_per_s=2e9, latency_s=1e-4)


def test_fit_recovers_a_linear_cost():
    """seconds = 2e-4 + 3e-12·flops + 5e-11·bytes, sampled exactly: the fit returns those three."""
    points = [(0, 1e6), (1e9, 1e6), (4e9, 3e6), (2e9, 8e6)]
    samples = [(f, b, 2e-4 + 3e-12 * f + 5e-11 * b) for f, b in points]
    a, b, c = fit(samples)
    assert a == pytest.approx(2e-4, rel=1e-6) and b == pytest.approx(3e-12, rel=1e-6)
    assert c == pytest.approx(5e-11, rel=1e-6)


def test_fit_keeps_coefficients_non_negative():
    """Times falling with bytes: the unconstrained fit would give c < 0; the feasible subsets drop it."""
    samples = [(0.0, 1.0, 3.0), (0.0, 2.0, 2.0), (0.0, 3.0, 1.0)]
    a, b, c = fit(samples)
    assert min(a, b, c) >= 0 and a == pytest.approx(2.0)  # the mean of 3, 2, 1 with c dropped


def test_node_class_joins_layers():
    k = SimpleNamespace(kind=KernelKind.GEMM, module="model.layers.13.self_attn.q_proj", name="q")
    assert node_class(k) == "model.layers.N.self_attn.q_proj"
    gather = SimpleNamespace(kind=KernelKind.EMBEDDING, module="", name="index_select")
    assert node_class(gather) == "@index_select"


def by_hand(kind: WorkerKind, seconds_per_flop: float, classes: list[str]) -> KindProfile:
    """A profile whose every node costs 5 µs plus its FLOPs at the given rate."""
    return KindProfile(kind=kind.name, model="llama-tiny", dtype="float32", page_size=16, shapes=(),
                       fits={c: (5e-6, seconds_per_flop, 0.0) for c in classes})


@pytest.fixture(scope="module")
def plans():
    source = open_model("llama-wide")
    graph = kernel_graph(source.arch, IterationShape(decode=4, context=64, chunks=1, chunk_len=60),
                         dtype=torch.float32)
    classes = sorted({node_class(k) for k in graph.kernels})
    # the half-speed worker takes twice as long for everything, as its duty cycle makes it
    cost = ProfileCost({FAST.name: by_hand(FAST, 2e-11, classes), SLOW.name: by_hand(SLOW, 4e-11, classes)})
    traffic = Traffic(prompt=48, output=48)
    split = plan_engine(source, torch.float32, CONFIG, (FAST, SLOW), traffic, cost, LINK)
    single = plan_engine(source, torch.float32, CONFIG, (FAST,), traffic, cost, LINK)
    return source, graph, cost, split, single


def test_planner_splits_over_a_fast_and_a_slow_worker(plans):
    source, graph, cost, split, single = plans
    n = len(graph.kernels)
    assert len(split.assignment) == n and set(split.assignment) == {0, 1}
    fast_s = [cost.kernel_time_s(k, unit_of(FAST, 0)) for k in graph.kernels]
    on_slow = sum(t for t, d in zip(fast_s, split.assignment, strict=True) if d == 1)
    # the slow worker, at half the speed, gets well under half of the work (a third balances the two)
    assert 0.15 * sum(fast_s) < on_slow < 0.5 * sum(fast_s)
    # the steady iteration's period max(m·T, L) (Plan.latency_s): the two workers overlap the groups
    assert split.plan.latency_s < 0.85 * single.plan.latency_s
    assert any(n.startswith("placement: ") for n in split.plan.notes)
    assert split.plan.engine.max_num_seqs == 8 and split.plan.engine.microbatches == 2
    assert split.plan.phases["mixed"].assignment == split.assignment


def test_plan_file_runs_node_for_node_and_simulates(plans, tmp_path, run_cli):
    source, _, _, split, _ = plans
    path = tmp_path / "plan.json"
    split.plan.save(path)
    back = from_file(str(path), source, 2, CONFIG.page_size)
    assert back.assignment == split.assignment and back.plan is not None
    code, out, err = run_cli(["simulate", str(path), "--workload", "offline", "--requests", "40", "--prompt",
                              "48", "--output", "48", "--json"])
    assert code == 0, err
    assert '"throughput_tokens_per_s"' in out


def test_a_capture_plan_is_carried_over_by_module():
    planned = SimpleNamespace(kernels=[
        SimpleNamespace(id=0, module="model.embed_tokens", layer=None),
        SimpleNamespace(id=1, module="model.layers.0.self_attn.q_proj", layer=0),
        SimpleNamespace(id=2, module="model.layers.0.self_attn.q_proj", layer=0),
        SimpleNamespace(id=3, module="model.layers.0.mlp.down_proj", layer=0),
        SimpleNamespace(id=4, module="model.layers.1.mlp.down_proj", layer=1)])
    engine = SimpleNamespace(kernels=[
        SimpleNamespace(module="model.embed_tokens", layer=None),
        SimpleNamespace(module="model.layers.0.self_attn.q_proj", layer=0),
        SimpleNamespace(module="model.layers.0", layer=0),  # a residual add: its layer's majority
        SimpleNamespace(module="model.layers.1.mlp.down_proj", layer=1),
        SimpleNamespace(module="lm_head", layer=None)])  # unknown: its predecessor's
    assert by_module(planned, (0, 1, 1, 0, 1), engine) == (0, 1, 1, 1, 1)
