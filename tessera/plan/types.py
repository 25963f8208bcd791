"""The plan files' types, defined in ``tessera.contracts.plan`` (the contracts between stages); this module
keeps the names where its readers import them."""

from tessera.contracts.plan import (
    PLAN_VERSION,
    POOL_PLAN_VERSION,
    Device,
    EngineSettings,
    PhasePlan,
    Plan,
    PoolCell,
    PoolPlan,
    Segment,
    StepPoint,
    plan_from_dict,
    read_plan_file,
)

__all__ = ["PLAN_VERSION", "POOL_PLAN_VERSION", "Device", "EngineSettings", "PhasePlan", "Plan", "PoolCell",
           "PoolPlan", "Segment", "StepPoint", "plan_from_dict", "read_plan_file"]
