"""Placement under the serving model: plan_serving (Tessera's kernel placement MILP and every baseline, each
at its best batch, micro-batch count and tensor parallelism under memory and SLO), the Plan and PoolPlan files.

This module is the only one other packages import (tests/test_imports.py checks it). Inside, the parts:
``model/`` (the serving model), ``solver/`` (the placement MILP, its bounds and the verifier),
``baselines/`` (the four coarse alternatives), ``search.py`` (plan_serving), ``config.py`` (PlannerConfig
and the results), ``captures.py`` (the capture cache), ``pool.py``, ``strategies.py`` (placement rules),
``deploy.py`` (serving commands for a plan), ``tables.py`` (the terminal table of a result) and ``forked.py``
(the search's tasks shared with forked processes).
"""

from tessera.contracts.plan import (
    Device,
    EngineSettings,
    PhasePlan,
    Plan,
    PoolCell,
    PoolPlan,
    Segment,
    StepPoint,
)
from tessera.plan.baselines.attention_ffn import is_attention_kernel
from tessera.plan.baselines.layer_pipeline import rule as layer_pipeline_rule
from tessera.plan.baselines.prefill_decode import decode_shape, prefill_shape
from tessera.plan.captures import GraphSource, capture_source
from tessera.plan.config import PlannerConfig, ServingResult, StrategyResult, planner_provenance
from tessera.plan.deploy import launch_lines, result_json, save_deployment
from tessera.plan.model.cell import Shapes, make_plan, model_kind
from tessera.plan.model.serving import BATCHES, Slo, Traffic, batch_ceiling, score_point, steady_shape
from tessera.plan.model.shapes import IterShape
from tessera.plan.model.units import UnitCost, make_unit
from tessera.plan.pool import Pool, engine_gpu, resolve_gpu
from tessera.plan.search import (
    STRATEGIES,
    cell_strategy,
    homogeneous,
    latency_variant,
    plan_graph,
    plan_serving,
)
from tessera.plan.solver.problem import default_cost
from tessera.plan.solver.solve import prepare, solve_phase
from tessera.plan.solver.verify import Message, evaluate, list_schedule_s
from tessera.plan.strategies import milp, uniform
from tessera.plan.tables import result_table

__all__ = [
    "BATCHES", "STRATEGIES", "Device", "EngineSettings", "GraphSource", "IterShape", "Message", "PhasePlan",
    "Plan", "PlannerConfig", "Pool", "PoolCell", "PoolPlan", "Segment", "ServingResult", "Shapes", "Slo",
    "StepPoint", "StrategyResult", "Traffic", "UnitCost", "batch_ceiling", "capture_source", "cell_strategy",
    "decode_shape", "default_cost", "engine_gpu", "evaluate", "homogeneous", "is_attention_kernel",
    "latency_variant", "launch_lines", "layer_pipeline_rule", "list_schedule_s", "make_plan", "make_unit",
    "milp", "model_kind", "plan_graph", "plan_serving", "planner_provenance", "prefill_shape", "prepare", "resolve_gpu",
    "result_json", "result_table", "save_deployment", "score_point", "solve_phase", "steady_shape", "uniform",
]
