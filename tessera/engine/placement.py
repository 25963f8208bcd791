"""Which worker runs each node of the engine's program: ``--placement plan|layer_split|attention_gemm|
interleave|PLAN.json``, over the devices actually given.

- A named rule (``tessera.runtime.placements``) places ``kernels.kernel_graph`` (kernel i is node i).
- ``plan``: tessera.plan places the program's kernels for the run's engine settings and traffic: CPU
  workers priced by their own kind's profile (``profile.ProfileCost``: measured in a worker of that kind),
  CUDA devices by their catalog type (tessera.cost), the link between CPU workers as probed. The MILP
  (``tessera.plan.milp``, async objective, a speed-proportional layer split as its start) places
  the serving model's steady iteration (``serving.steady_shape``), ``serving.score_point`` scores it at the
  run's token budget, and ``cell.make_plan`` writes the Plan file (version 2: engine settings, per
  micro-batch step points) that ``tessera simulate`` reads. ``EngineShapes`` gives the planner the
  engine's kernel graph at any of its iteration shapes.
- ``PLAN.json``: a Plan's "mixed" assignment; one made here is node for node, one from ``tessera plan``
  (a capture of the model) is carried over by module path (each node takes the device most of the plan's
  kernels of its module run on, else of its layer, else its predecessor's).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

from tessera.contracts.plan import Plan
from tessera.engine.arch import ModelArch
from tessera.engine.config import EngineConfig
from tessera.engine.devices import WorkerKind
from tessera.engine.inputs import IterationShape
from tessera.engine.kernels import kernel_graph
from tessera.engine.loader import ModelSource
from tessera.engine.memory import available_bytes
from tessera.engine.profile import ProfileCost
from tessera.engine.routes import Placement
from tessera.errors import UserError
from tessera.graph import KernelGraph
from tessera.hardware import GpuSpec, LinkSpec, gpu
from tessera.plan import (
    IterShape,
    PlannerConfig,
    Pool,
    Slo,
    Traffic,
    layer_pipeline_rule,
    make_plan,
    milp,
    plan_graph,
    resolve_gpu,
    score_point,
    steady_shape,
)
from tessera.runtime.placements import MILP, PLACEMENTS

NAMES = (*PLACEMENTS, MILP)
LENIENT_SLO = Slo(ttft_s=600.0, tpot_s=60.0)  # CPU runs: every operating point has a knee to report


class EngineShapes:
    """tessera.plan.Shapes for the engine: the program's kernel graph at a serving-model IterShape (a
    chunk of c tokens in pieces of chunk_len is ⌈c / chunk_len⌉ prompt pieces of chunk_len), cached."""

    images = False

    def __init__(self, source: ModelSource, dtype: torch.dtype, page_size: int, traffic: Traffic) -> None:
        self.model, self.arch, self.dtype = source.name, source.arch, dtype
        self.page_size, self.traffic = page_size, traffic
        # one decode whose pages hold exactly page_size tokens: the KV bytes per token
        # (cell.kv_bytes_per_token)
        self.base = self.engine(IterationShape(decode=1, context=page_size - 1))
        self._cache: dict[IterShape, KernelGraph] = {}

    def engine(self, shape: IterationShape) -> KernelGraph:
        return kernel_graph(self.arch, shape, model=self.model, dtype=self.dtype, page_size=self.page_size)

    def at(self, s: IterShape) -> KernelGraph:
        if s not in self._cache:
            piece = s.chunk_len or s.chunk
            self._cache[s] = self.engine(IterationShape(
                decode=s.decode, context=max(1, s.context) if s.decode else 0,
                chunks=math.ceil(s.chunk / piece) if s.chunk else 0, chunk_len=piece if s.chunk else 0,
                prefix=s.prefix if s.chunk else 0))
        return self._cache[s]

    def graph(self, batch: int, m: int) -> KernelGraph:
        return self.at(steady_shape(batch, m, self.traffic))


def unit_of(kind: WorkerKind, index: int) -> GpuSpec:
    """The planner's device for a worker: a CPU kind is the catalog's ``cpu`` under the kind's name (its
    profile prices it; memory: what the host has available); a CUDA device its catalog GPU type."""
    if not kind.cuda:
        mem = available_bytes() or gpu("cpu").mem_bytes
        return replace(gpu("cpu"), name=kind.name, mem_bytes=mem)
    name = torch.cuda.get_device_name(index) if torch.cuda.is_available() else ""
    for word in name.replace("NVIDIA", "").split():
        try:
            return resolve_gpu(word)
        except UserError:
            continue
    raise UserError(f"device {kind.device} ({name or 'not visible'}) has no catalog type to plan with; "
                    f"give --placement layer_split or a PLAN.json")


def node_names(arch: ModelArch, page_size: int) -> list[str]:
    """The program's node names, in order (from a fake trace: nothing allocated)."""
    return list(kernel_graph(arch, IterationShape(decode=1, context=1), page_size=page_size).meta["nodes"])


def named(name: str, source: ModelSource, n: int, page_size: int) -> Placement:
    """A rule of tessera.runtime.placements on the program's kernel graph (one worker: everything on it)."""
    if name not in PLACEMENTS:
        raise UserError(f"unknown placement {name!r}; valid: {', '.join(NAMES)}, or a PLAN.json")
    graph = kernel_graph(source.arch, IterationShape(decode=1, context=1), page_size=page_size)
    if n == 1:
        return Placement(assignment=(0,) * len(graph.kernels), label=name)
    return Placement(assignment=tuple(PLACEMENTS[name](graph, n)), label=name)


def plan_engine(source: ModelSource, dtype: torch.dtype, config: EngineConfig, kinds: tuple[WorkerKind, ...],
                traffic: Traffic, cost: ProfileCost, link: LinkSpec, slo: Slo = LENIENT_SLO,
                assignment: tuple[int, ...] | None = None) -> Placement:
    """tessera.plan's placement and Plan for these workers at the engine's settings (module docstring);
    with ``assignment``, that placement scored and written as a Plan instead of the MILP's."""
    units = tuple(unit_of(k, i) for i, k in enumerate(kinds))
    shapes = EngineShapes(source, dtype, config.page_size, traffic)
    b, m, budget = config.max_num_seqs, config.microbatches, config.max_num_batched_tokens
    if budget <= config.group_seqs:
        raise UserError(f"max-num-batched-tokens {budget} leaves no prompt tokens beside a group's "
                        f"{config.group_seqs} decodes; raise it above {config.group_seqs}")
    g = shapes.graph(b, m)
    link_units = dict(units=units, link=link, cost=cost)
    candidates = ({"given": assignment} if assignment is not None
                  else candidate_placements(g, b, m, **link_units))
    if not candidates:
        raise UserError(f"the planner found no placement of {source.name} on {len(units)} workers that fits")
    points = {name: score_point(g, a, batch=b, m=m, traffic=traffic, slo=slo, at=shapes.at, budgets=(budget,),
                                **link_units) for name, a in candidates.items()}
    chosen = max(points, key=lambda name: (points[name].throughput, -len(name)))
    point = points[chosen]
    plan = make_plan("tessera", point, shapes, units, link, cost, PlannerConfig(traffic=traffic, slo=slo))
    plan = replace(plan, notes=(*plan.notes, f"placement: {chosen} (of {', '.join(sorted(candidates))})"))
    return Placement(assignment=point.assignment, label=MILP if assignment is None else "scored", plan=plan)


def candidate_placements(g: KernelGraph, b: int, m: int, *, units: tuple[GpuSpec, ...], link: LinkSpec,
                         cost: ProfileCost) -> dict[str, tuple[int, ...]]:
    """The MILP's placement (async objective, the layer pipeline's split as its start) and the layer
    pipeline's speed-proportional split itself: the serving model's knee picks between them (the MILP's
    objective is the steady shape's period, which a placement crossing between workers many times can
    meet while the groups' interleaving, which the knee models, makes it slower)."""
    if len(units) == 1:
        return {"single": (0,) * len(g.kernels)}
    layers = layer_pipeline_rule(units, link, cost)
    out = {}
    found = milp(Pool(gpus=units, link=link), cost, starts=[layers])(g, b, m)
    if found is not None:
        out["milp"] = tuple(found)
    split = layers(g, b, m)
    if split is not None:
        out["layer_pipeline"] = tuple(split)
    return out


def from_file(path: str, source: ModelSource, n: int, page_size: int) -> Placement:
    """A Plan file's "mixed" assignment on the program's nodes (module docstring)."""
    plan = Plan.load(path)
    if len(plan.devices) != n:
        raise UserError(f"plan {path} places {len(plan.devices)} devices but --devices names {n}")
    phase = plan.phases.get("mixed")
    if phase is None:
        raise UserError(f"plan {path} has no serving iteration (phases: {', '.join(sorted(plan.phases))}); "
                        f"write it with `tessera plan MODEL ... -o FILE`")
    engine = kernel_graph(source.arch, IterationShape(decode=1, context=1), page_size=page_size)
    if len(phase.assignment) == len(engine.kernels):  # made on the engine's program
        return Placement(assignment=tuple(phase.assignment), label=str(path), plan=plan)
    return Placement(assignment=by_module(plan_graph(plan), tuple(phase.assignment), engine), label=str(path),
                     plan=plan)


def by_module(planned: KernelGraph, assignment: tuple[int, ...], engine: KernelGraph) -> tuple[int, ...]:
    """Each engine kernel on the device most of the planned kernels of its module run on, else of its
    layer, else its predecessor's (the first: device 0)."""
    module: dict[str, Counter] = {}
    layer: dict[int, Counter] = {}
    for k in planned.kernels:
        module.setdefault(k.module, Counter())[assignment[k.id]] += 1
        if k.layer is not None:
            layer.setdefault(k.layer, Counter())[assignment[k.id]] += 1
    out: list[int] = []
    for k in engine.kernels:
        votes = module.get(k.module) or (layer.get(k.layer) if k.layer is not None else None)
        out.append(votes.most_common(1)[0][0] if votes else (out[-1] if out else 0))
    return tuple(out)


def choose(spec: str, source: ModelSource, dtype: torch.dtype, config: EngineConfig,
           kinds: tuple[WorkerKind, ...],
           traffic: Traffic, cost: ProfileCost | None = None, link: LinkSpec | None = None) -> Placement:
    """``--placement``: a PLAN.json path, ``plan`` (needs ``cost`` and ``link``), or a named rule."""
    if spec.endswith(".json") or Path(spec).is_file():
        return from_file(spec, source, len(kinds), config.page_size)
    if spec == MILP:
        if len(kinds) == 1:
            return Placement(assignment=(0,) * len(node_names(source.arch, config.page_size)), label=MILP)
        assert cost is not None and link is not None, "placement plan needs the kinds' costs and the link"
        return plan_engine(source, dtype, config, kinds, traffic, cost, link)
    return named(spec, source, len(kinds), config.page_size)
