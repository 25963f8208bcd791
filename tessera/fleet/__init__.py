"""Plans a fleet: forms cells from a many-GPU pool, replicates them, and advises which GPU mix to rent."""

from tessera.fleet.fleet import FleetCell, FleetPlan, plan_fleet, plan_pool_file, replan_without
from tessera.fleet.spec import FleetSpec

__all__ = ["FleetCell", "FleetPlan", "FleetSpec", "plan_fleet", "plan_pool_file", "replan_without"]
