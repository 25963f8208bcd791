"""The contracts between stages: the typed values one stage hands the next, each with one serializer.

This package sits below every stage and imports none of them at run time; a stage imports the contracts it
reads or writes from here. It holds ``Provenance`` (what every JSON file Tessera writes carries), the
simulator's ``SimResult``, the SLO as planned (``Slo``) and as judged (``LatencyTargets``), what the planner
asks of a cost model (``KernelCosts``), the report's ``FrontierPoint``, the strategies' names (``Strategy``, a
StrEnum, and ``STRATEGIES``), the closed sets ``Phase`` and ``Objective``, the kernel-graph IR
(``tessera.contracts.ir``; ``tessera.graph`` keeps its names) and the plan files' types
(``tessera.contracts.plan``; ``tessera.plan`` re-exports them).
"""

from tessera.contracts.cost import KernelCosts
from tessera.contracts.enums import STRATEGIES, Objective, Phase, Strategy
from tessera.contracts.ir import KernelGraph
from tessera.contracts.plan import Plan, PoolPlan, read_plan_file
from tessera.contracts.provenance import FINGERPRINT_HEX, Provenance, fingerprint, of_file
from tessera.contracts.results import FrontierPoint, SimResult
from tessera.contracts.slo import SLO_TARGET, LatencyTargets, Slo

__all__ = ["FINGERPRINT_HEX", "SLO_TARGET", "STRATEGIES", "FrontierPoint", "KernelCosts", "KernelGraph", "LatencyTargets",
           "Objective", "Phase", "Plan", "PoolPlan", "Provenance", "SimResult", "Slo", "Strategy", "fingerprint",
           "of_file", "read_plan_file"]
