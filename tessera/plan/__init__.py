"""Placement under the serving model: plan_serving (Tessera's kernel placement MILP and every baseline, each
at its best batch, micro-batch count and tensor parallelism under memory and SLO), the Plan and PoolPlan files."""

from tessera.plan.pool import Pool
from tessera.plan.search import STRATEGIES, PlannerConfig, ServingResult, StrategyResult, plan_serving
from tessera.plan.types import Device, EngineSettings, PhasePlan, Plan, PoolCell, PoolPlan, Segment, StepPoint

__all__ = ["STRATEGIES", "Device", "EngineSettings", "PhasePlan", "Plan", "PlannerConfig", "Pool", "PoolCell", "PoolPlan",
           "Segment", "ServingResult", "StepPoint", "StrategyResult", "plan_serving"]
