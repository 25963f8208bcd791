"""Re-planning onto the surviving workers when one is lost (issue 8, runtime half).

A lost worker ends its cluster (Cluster._fail stops every worker: a gloo group cannot shrink). The driver
then re-plans every kernel onto the surviving devices (``replan``: the MILP, or a layer split), starts one
fresh worker per survivor, each loading only the weights its new share touches, and runs the interrupted
round again from its first step (its KV and state died with the lost worker). Finished rounds are kept;
rounds are seeded by their index, so the tokens equal single-process execution.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from tessera.capture.fuse import unfuse
from tessera.graph import KernelGraph
from tessera.runtime.cluster import Cluster, ClusterConfig, WorkerFailure
from tessera.runtime.partition import Partition
from tessera.runtime.program import CapturedProgram
from tessera.runtime.runner import ClusterExecutor, build_partitions, phase_of
from tessera.text import plural

log = logging.getLogger("tessera.runtime")

Replan = Callable[[dict[str, KernelGraph], int], dict[str, tuple[int, ...]]]  # phase graphs, devices -> plan


def replan_with(placement: str, microbatches: int = 2) -> Replan:
    """A Replan by placement name (``plan``: the MILP); a lone survivor runs everything."""
    from tessera.runtime.placements import all_on, placements

    def f(graphs: dict[str, KernelGraph], devices: int) -> dict[str, tuple[int, ...]]:
        if devices == 1:
            return {ph: unfuse(g, all_on(g)) for ph, g in graphs.items()}
        return placements(placement, graphs, devices, microbatches)

    return f


def phase_graphs(programs: dict[str, CapturedProgram]) -> dict[str, KernelGraph]:
    """Each phase's eager graph: kernel i is op i of its programs."""
    out: dict[str, KernelGraph] = {}
    for key, p in programs.items():
        out.setdefault(phase_of(key), p.graph)
    return out


def placement_graphs(programs: dict[str, CapturedProgram]) -> dict[str, KernelGraph]:
    """Each phase's graph to place: the fused view where the capture made one (a Replan of these returns
    assignments of the eager ops all the same)."""
    out: dict[str, KernelGraph] = {}
    for key, p in programs.items():
        out.setdefault(phase_of(key), p.placement_graph)
    return out


class RecoveringExecutor:
    """An Executor over a Cluster that, on ``recover(failure)``, re-plans onto the survivors and restarts."""

    def __init__(self, programs: dict[str, CapturedProgram], plans: dict[str, dict[str, tuple[int, ...]]],
                 config: ClusterConfig, replan: Replan) -> None:
        self.programs, self.plans, self.config, self.replan = programs, plans, config, replan
        self.parts = build_partitions(programs, plans, len(config.devices))
        self.cluster = Cluster(programs, self.parts, config)
        self.device_ids = list(range(len(config.devices)))  # original index of each current worker
        self.events: list[str] = []
        self.runs: list[tuple[list[dict[str, Any]], dict[tuple[str, str], Partition], ClusterConfig]] = []

    def __enter__(self) -> RecoveringExecutor:
        self.cluster.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.close()
        if not self.runs or self.runs[-1][0] is not self.cluster.history:
            self.runs.append((self.cluster.history, self.parts, self.config))

    def step(self, key: str, plan: str, inputs: list[dict[int, torch.Tensor]], *, reset: bool
             ) -> list[list[torch.Tensor]]:
        return ClusterExecutor(self.cluster).step(key, plan, inputs, reset=reset)

    def recover(self, failure: WorkerFailure) -> None:
        """Re-plan onto the survivors of ``failure`` and start them; raises it again if none survive."""
        t0 = time.monotonic()
        lost = failure.rank
        survivors = [i for i in range(len(self.config.devices)) if i != lost]
        if lost < 0 or not survivors:
            raise failure
        self.runs.append((self.cluster.history, self.parts, self.config))
        assign = self.replan(placement_graphs(self.programs), len(survivors))
        self.plans = {name: assign for name in self.plans}
        self.parts = build_partitions(self.programs, self.plans, len(survivors))
        self.config = replace(self.config, devices=tuple(self.config.devices[i] for i in survivors))
        self.device_ids = [self.device_ids[i] for i in survivors]
        self.cluster = Cluster(self.programs, self.parts, self.config)
        self.cluster.start()
        msg = (f"{failure}; re-planned onto {plural(len(survivors), 'surviving worker')} (original devices "
               f"{self.device_ids}) and restarted them in {time.monotonic() - t0:.1f} s")
        self.events.append(msg)
        log.warning("recovery: %s", msg)
