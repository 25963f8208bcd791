"""Discrete-event serving simulator: any Plan -> serving metrics (see docs/sim.md)."""

from tessera.sim.adaptive import AdaptivePolicy, check_switchable
from tessera.sim.api import Run, run, simulate
from tessera.sim.metrics import SLO, SimResult
from tessera.sim.model import SchedulerConfig
from tessera.sim.workload import LengthSpec, WorkloadSpec

__all__ = ["SLO", "AdaptivePolicy", "LengthSpec", "Run", "SchedulerConfig", "SimResult", "WorkloadSpec",
           "check_switchable", "run", "simulate"]
