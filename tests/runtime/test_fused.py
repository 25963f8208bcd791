"""Placements made on the fused view run each fused kernel's ops on one worker, bit-identical to one process."""

from __future__ import annotations

import pytest
import torch

from tessera.capture import capture_model
from tessera.capture.fuse import unfuse
from tessera.runtime.cluster import Cluster, ClusterConfig
from tessera.runtime.placements import carry_over, layer_split, placements
from tessera.runtime.recovery import placement_graphs
from tessera.runtime.runner import ClusterExecutor, build_partitions, compare, run_round
from tessera.runtime.steps import Job, LocalExecutor, capture_steps

pytestmark = pytest.mark.slow


def _fused_plans(programs: dict) -> dict[str, dict[str, tuple[int, ...]]]:
    graphs = placement_graphs(programs)
    for ph, g in graphs.items():
        assert g.meta["view"] == "fused" and len(g.kernels) < g.meta["eager_kernels"] / 2, ph
    plans = {name: placements(name, graphs, 2) for name in ("layer_split", "attention_gemm")}
    for by_phase in plans.values():
        for ph, a in by_phase.items():
            prog = next(p for k, p in programs.items() if k.split("@")[0] == ph)
            assert len(a) == len(prog.ops) and set(a) == {0, 1}  # eager length, a real split
            for group in graphs[ph].meta["fused_from"]:  # a fused kernel's ops all run on one worker
                assert len({a[i] for i in group}) == 1
    return plans


@pytest.mark.parametrize("model", ["llama-tiny", "mamba2-tiny"])
def test_fused_placements_are_bit_identical_to_one_process(model: str) -> None:
    job = Job(model=model, seq=6, new_tokens=3)
    programs = capture_steps(job)
    plans = _fused_plans(programs)
    parts = build_partitions(programs, plans, 2)
    torch.set_num_threads(1)
    local = LocalExecutor(programs)
    with Cluster(programs, parts, ClusterConfig(devices=("cpu", "cpu"), max_microbatches=2)) as cluster:
        for i, name in enumerate(plans):
            got = run_round(ClusterExecutor(cluster), job, programs, name, 2, i)
            want = run_round(local, job, programs, name, 2, i)
            assert compare([got], [want]) == (True, 0.0, True), f"{model} under fused {name}"


def test_a_plan_on_the_planners_fused_capture_carries_onto_the_runtime_program() -> None:
    """The planner captures bf16 under fake tensors (extra casts inside the fused norms), the runtime fp32:
    the fused kernel sequences align one to one, so a layer split carries over exactly."""
    programs = capture_steps(Job(model="llama-tiny", seq=6, new_tokens=2))
    prog = programs["decode@6"]
    planner = capture_model("llama-tiny", "decode", batch=1, context=6)
    assert len(planner.kernels) == len(prog.placement_graph.kernels)
    got = unfuse(prog.placement_graph, carry_over(planner, layer_split(planner, 2), prog.placement_graph))
    assert got == placements("layer_split", {"decode": prog.placement_graph}, 2)["decode"]
