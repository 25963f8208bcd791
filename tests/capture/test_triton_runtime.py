"""A placement that splits Liger's Triton kernels between two CPU workers: identical to one process."""

from __future__ import annotations

import pytest
import torch

from tessera.runtime.cluster import Cluster, ClusterConfig
from tessera.runtime.placements import placements
from tessera.runtime.recovery import placement_graphs
from tessera.runtime.runner import ClusterExecutor, build_partitions, compare, run_round
from tessera.runtime.steps import Job, LocalExecutor, capture_steps

pytestmark = pytest.mark.slow


# Triton launches per step, by hand: llama 2 layers × (2 norms, rotary, SwiGLU) + final norm = 9;
# mixtral (Liger's RMSNorm and rotary only; its fused-MoE SwiGLU is left out) 2 × (2 norms, rotary) + 1 = 7.
@pytest.mark.parametrize(("model", "launches"), [("llama-tiny-liger", 9), ("mixtral-tiny-liger", 7)])
def test_layer_split_of_triton_kernels_is_bit_identical_to_one_process(model: str, launches: int) -> None:
    job = Job(model=model, seq=6, new_tokens=2)
    programs = capture_steps(job)
    graphs = placement_graphs(programs)
    plans = {"layer_split": placements("layer_split", graphs, 2)}
    for ph, a in plans["layer_split"].items():
        prog = next(p for k, p in programs.items() if k.split("@")[0] == ph)
        triton_ops = [i for i, op in enumerate(prog.ops) if op.func.startswith("triton:")]
        assert len(triton_ops) == launches
        assert {a[i] for i in triton_ops} == {0, 1}  # Triton kernels on both workers
    parts = build_partitions(programs, plans, 2)
    torch.set_num_threads(1)
    with Cluster(programs, parts, ClusterConfig(devices=("cpu", "cpu"), max_microbatches=2)) as cluster:
        got = run_round(ClusterExecutor(cluster), job, programs, "layer_split", 2, 0)
        want = run_round(LocalExecutor(programs), job, programs, "layer_split", 2, 0)
    assert compare([got], [want]) == (True, 0.0, True)
