"""Placement: the memory-aware kernel placement MILP, the baselines in the same terms, the Plan file."""

from tessera.plan.planner import STRATEGIES, Outcome, PlanResult, plan_graphs, plan_model
from tessera.plan.pool import Pool, Workload
from tessera.plan.types import Device, PhasePlan, Plan, StepPoint

__all__ = ["STRATEGIES", "Device", "Outcome", "PhasePlan", "Plan", "PlanResult", "Pool", "StepPoint", "Workload",
           "plan_graphs", "plan_model"]
