"""Discrete-event serving simulator: any Plan -> serving metrics (see docs/sim.md)."""

from tessera.contracts.slo import LatencyTargets
from tessera.sim.adaptive import AdaptivePolicy, check_switchable
from tessera.sim.api import Run, run, simulate
from tessera.sim.failure import Cell, Failure
from tessera.sim.knee import KneeConfig, MeasuredKnee, find_knee
from tessera.sim.metrics import SimResult
from tessera.sim.model import SchedulerConfig
from tessera.sim.pool import run_pool, simulate_pool
from tessera.sim.workload import LengthSpec, WorkloadSpec

__all__ = ["AdaptivePolicy", "Cell", "Failure", "KneeConfig", "LatencyTargets", "LengthSpec", "MeasuredKnee",
           "Run", "SchedulerConfig", "SimResult", "WorkloadSpec", "check_switchable", "find_knee", "run",
           "run_pool", "simulate", "simulate_pool"]
