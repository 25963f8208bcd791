"""What the report reads: compare cells (`tessera plan/compare --json`), simulator results
(`tessera simulate --json`), plans and graphs; parsed once into frozen values with one-line errors."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from tessera.contracts.enums import STRATEGIES
from tessera.contracts.ir import KernelGraph
from tessera.contracts.plan import Plan, PoolPlan
from tessera.contracts.provenance import Provenance, fingerprint, of_file
from tessera.contracts.results import FrontierPoint, SimResult, StrategyFigures
from tessera.contracts.study import EvalStudy
from tessera.errors import UserError

# Order in which strategies appear everywhere (tables, bars, legends); unknown names follow, sorted.
BASELINES = STRATEGIES[1:]


def strategy_order(names: set[str] | list[str]) -> list[str]:
    known = [s for s in STRATEGIES if s in names]
    return known + sorted(set(names) - set(STRATEGIES))


@dataclass(frozen=True, kw_only=True)
class RentOption:
    """One thing a user could rent, with its goodput at the SLO: the asked-for pool under a strategy, a
    same-size homogeneous pool from the compare matrix, or an advisor's GPU mix for a budget."""

    label: str
    gpus: tuple[str, ...]  # catalog names, one entry per GPU rented
    usd_per_hour: float
    goodput_tokens_per_s: float  # predicted by the planner at the SLO
    source: str  # where the figure comes from, shown beside it

    def __post_init__(self) -> None:
        if not (self.usd_per_hour > 0 and self.goodput_tokens_per_s > 0 and self.gpus):
            raise ValueError(f"rent option {self.label!r}: usd_per_hour={self.usd_per_hour}, "
                             f"goodput_tokens_per_s={self.goodput_tokens_per_s} and gpus={self.gpus} must be "
                             "positive and non-empty")

    @property
    def usd_per_million_tokens(self) -> float:
        return self.usd_per_hour / (self.goodput_tokens_per_s * 3600) * 1e6


@dataclass(frozen=True, kw_only=True)
class CompareCell:
    """One model on one GPU set: every strategy's predicted throughput and cost."""

    model: str
    gpus: tuple[str, ...]
    mode: str
    solve_s: float | None
    bound_ratio: float | None
    unit: str  # "tokens/s" | "images/s"
    strategies: dict[str, StrategyFigures] = field(hash=False)
    reference: RentOption | None = None  # `tessera compare`: the best same-size homogeneous deployment

    @property
    def pool(self) -> str:
        return "+".join(self.gpus)

    def best_baseline(self) -> StrategyFigures | None:
        """The scored baseline with the highest throughput (None when no baseline applies)."""
        scored = [r for n, r in self.strategies.items() if n != "tessera" and r.scored]
        return max(scored, key=lambda r: r.throughput_per_s or 0.0, default=None)

    def speedup(self) -> float | None:
        """Tessera's throughput over the best baseline's."""
        t, b = self.strategies.get("tessera"), self.best_baseline()
        if t is None or b is None or not t.scored:
            return None
        return (t.throughput_per_s or 0.0) / (b.throughput_per_s or 1.0)

    def cost_gain(self) -> float | None:
        """Tessera's throughput per dollar-hour over the best baseline's on that measure."""
        t = self.strategies.get("tessera")
        effs = [r.throughput_per_usd_hour for n, r in self.strategies.items() if n != "tessera"]
        best = max((e for e in effs if e is not None), default=None)
        if t is None or best is None or t.throughput_per_usd_hour is None:
            return None
        return t.throughput_per_usd_hour / best

    def per_dollar_gain(self) -> float | None:
        """Tessera's goodput per dollar over the best same-size homogeneous deployment's (compare only)."""
        t, ref = self.strategies.get("tessera"), self.reference
        if t is None or ref is None or t.throughput_per_usd_hour is None:
            return None
        return t.throughput_per_usd_hour / (ref.goodput_tokens_per_s / ref.usd_per_hour)


@dataclass(frozen=True, kw_only=True)
class SimRun:
    """One simulation as the report shows it: the simulator's ``result``, read with its own serializer, under
    a ``label`` (which plan it simulated: a strategy name, usually) at its operating point."""

    label: str
    result: SimResult
    # The run's operating point, from the file's provenance (or, in a file written before it had one, the
    # keys `make demo` wrote beside the contract): offered request rate, the seed, the plan's predicted
    # goodput (its capacity at the SLO, output tokens/s; `make demo` only), output tokens per request, and the
    # SLO the attainment was measured against.
    rate_per_s: float | None = None
    seed: int | None = None
    capacity_tokens_per_s: float | None = None
    output_tokens: int | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    provenance: Provenance | None = None  # what the file says it simulated (None: a file from before it did)

    def __post_init__(self) -> None:
        r = self.result
        if r.completed > r.requests or min(r.requests, r.completed, r.lost) < 0:
            raise UserError(f"simulator result {self.label!r}: completed={r.completed}, lost={r.lost} "
                            f"and requests={r.requests} must be counts with completed <= requests")

    @property
    def goodput_tokens_per_s(self) -> float | None:
        """Output tokens/s of the requests that met the SLO: every request has the same output length in
        these runs, so it is the throughput times the share of *completed* requests meeting it."""
        r = self.result
        if r.slo_attainment is None or r.completed == 0:
            return None
        return r.throughput_tokens_per_s * r.slo_attainment * r.requests / r.completed

    @property
    def offered_tokens_per_s(self) -> float | None:
        if self.rate_per_s is None or self.output_tokens is None:
            return None
        return self.rate_per_s * self.output_tokens

    @property
    def load(self) -> float | None:
        """Offered output tokens/s over the plan's predicted capacity: 1.0 is saturation."""
        offered = self.offered_tokens_per_s
        if offered is None or not self.capacity_tokens_per_s:
            return None
        return offered / self.capacity_tokens_per_s


@dataclass(frozen=True, kw_only=True)
class GpuFacts:
    """What the report states about one GPU type it names, looked up by its caller in the hardware catalog and
    the cost model (tessera.study.report_facts); ``vendor`` None: the GPU is not in the catalog."""

    name: str
    cost_source: str  # where its kernel costs come from: measured tables, or a transfer (in words)
    vendor: str | None = None
    usd_per_hour: float = 0.0
    price_date: str = ""
    price_source: str = ""
    dtypes: tuple[str, ...] = ()  # the dtypes with a datasheet rate (fp32, tf32, bf16, fp16, fp8 order)
    spec_source: str = ""


class GanttSpan(Protocol):
    """One bar of a pipeline Gantt as the simulator lays it out (tessera.sim.trace.Span has these fields)."""

    @property
    def row(self) -> str: ...  # "dev0 H100-SXM" or "link 0->1"

    @property
    def start_s(self) -> float: ...

    @property
    def dur_s(self) -> float: ...

    @property
    def microbatch(self) -> int: ...

    @property
    def kind(self) -> str: ...  # compute | link


@dataclass(frozen=True, kw_only=True)
class GanttFacts:
    """A plan's pipelined iterations laid out by the simulator, and the figure's title."""

    spans: tuple[GanttSpan, ...]
    title: str


@dataclass(frozen=True, kw_only=True)
class ReportData:
    """Every section is optional: None omits it with a one-line note, so a demo fills what exists."""

    title: str = "Tessera placement report"
    compare: tuple[CompareCell, ...] | None = None
    plan: Plan | None = None  # one cell's plan: what the placement pictures draw
    pool: PoolPlan | None = None  # the whole deployment when it is several different cells (``plan``: its lead)
    graphs: tuple[KernelGraph, ...] | None = None  # phases of `plan`, for the placement map
    sims: tuple[SimRun, ...] | None = None  # each plan at its operating point, one entry per seed
    sweep: tuple[SimRun, ...] | None = None  # each plan at several offered rates: goodput-vs-rate curves
    gantt_png: Path | None = None  # `tessera simulate --gantt` output; None: drawn from `plan` if given
    frontier: tuple[FrontierPoint, ...] | None = None  # advisor mixes; else derived from `compare`
    frontier_title: str = "Advisor: GPU mixes on the throughput–cost plane"
    commands: tuple[str, ...] = ()  # shell commands that reproduce the inputs
    deploy: tuple[str, ...] = ()  # the commands that serve the plan (tessera.plan.launch_lines)
    options: tuple[RentOption, ...] = ()  # alternatives to the plan's pool (same-size homogeneous, advisor)
    baseline_plans: tuple[Plan | PoolPlan, ...] = ()  # the other strategies' deployments (memory comparison)
    evaluation: EvalStudy | None = None  # `tessera evaluate --json` output (the study of shapes × pools)
    evaluation_maps: tuple[tuple[str, Path], ...] = ()  # (label, PNG): the study's best and worst placements
    cost_accuracy: CostAccuracy | None = None  # the cost model's measured error (bench_cost_aic.py)
    # What only the stages know, looked up by the caller (tessera.study.report_facts.with_facts): each named
    # GPU's catalog entry, the planner's goodput at the SLO and capacity before it of the deployment (all
    # cells and replicas, output tokens/s or images/s; None: the plan file has none), each baseline plan's
    # (strategy, goodput), and the Gantt of the plan's iterations (None: not drawn, or given as gantt_png).
    gpu_facts: tuple[GpuFacts, ...] = ()
    goodput_per_s: float | None = None
    capacity_per_s: float | None = None
    baseline_goodputs: tuple[tuple[str, float], ...] = ()
    gantt: GanttFacts | None = None

    def __post_init__(self) -> None:
        if self.pool is not None and self.plan != self.pool.lead:
            raise ValueError("ReportData: plan must be the pool's lead cell")
        if self.graphs and self.plan is None:
            raise UserError("a kernel graph was given without a plan: the placement map needs both")
        if self.gantt_png is not None and not Path(self.gantt_png).is_file():
            raise UserError(f"gantt image {self.gantt_png} does not exist")


    @property
    def deployment(self) -> Plan | PoolPlan | None:
        """What serves the traffic: the pool when there is one, else the plan."""
        return self.pool if self.pool is not None else self.plan

    def gpu(self, name: str) -> GpuFacts | None:
        """The catalog's entry for a GPU the report names; None: not in the catalog (or not looked up)."""
        return next((g for g in self.gpu_facts if g.name == name and g.vendor is not None), None)

    def cost_source(self, name: str) -> str:
        """Where a named GPU's kernel costs come from (in words)."""
        return next((g.cost_source for g in self.gpu_facts if g.name == name), "not in the catalog")


@dataclass(frozen=True, kw_only=True)
class CostAccuracy:
    """The cost model's error on kernel times (absolute percentage error, median and 90th percentile):
    ``unseen`` on a GPU it was not fitted on (leave one GPU out: what a GPU with transferred costs can
    expect), ``measured`` between the measured grid points of a GPU with tables (held-out points)."""

    unseen_median: float
    unseen_p90: float
    measured_median: float | None = None
    measured_p90: float | None = None
    source: str = ""  # the file the figures were read from

    def __post_init__(self) -> None:
        for k in ("unseen_median", "unseen_p90", "measured_median", "measured_p90"):
            v = getattr(self, k)
            if v is not None and not 0 <= v < 10:
                raise ValueError(f"cost accuracy {k}={v} must be a share (0.064 for 6.4%)")


def load_cost_accuracy(path: Path) -> CostAccuracy:
    """`bench/bench_cost_aic.py`'s JSON (leave_one_gpu_out and interpolation) or `tessera cost validate
    --source aic --json` (one leave-one-GPU-out report)."""
    raw = read_json(path, "cost accuracy")
    loo = raw.get("leave_one_gpu_out", raw) if isinstance(raw, dict) else None
    over = loo.get("overall") if isinstance(loo, dict) else None
    if not isinstance(over, dict):
        raise UserError(f"cost accuracy file {path} is neither bench_cost_aic.py's JSON nor `tessera cost validate "
                        "--source aic --json` output (needs an \"overall\" error object)")
    where = f"cost accuracy file {path}"
    interp = (raw.get("interpolation") or {}).get("overall") if isinstance(raw, dict) else None
    return CostAccuracy(unseen_median=_num(over, "median_ape", where) or 0.0,
                        unseen_p90=_num(over, "p90_ape", where) or 0.0,
                        measured_median=_num(interp, "median_ape", where) if isinstance(interp, dict) else None,
                        measured_p90=_num(interp, "p90_ape", where) if isinstance(interp, dict) else None,
                        source=str(path))


# ---- parsing --------------------------------------------------------------------------------------

def _num(d: dict[str, Any], key: str, where: str, *, optional: bool = False) -> float | None:
    v = d.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
        raise UserError(f"{where}: field {key!r} must be a number, got {v!r}")
    return float(v)


def parse_strategy(name: str, d: dict[str, Any], where: str) -> StrategyFigures:
    where = f"{where} strategy {name!r}"
    if not isinstance(d, dict) or "applicable" not in d:
        raise UserError(f"{where}: expected an object with 'applicable', got {str(d)[:60]!r}")
    # `tessera plan --json` has throughput_*; `tessera compare --json` goodput_* (at the SLO)
    keys = ("throughput_images_per_s", "goodput_images_per_s", "throughput_tokens_per_s", "goodput_tokens_per_s")
    tp_key = next((k for k in keys if k in d), "throughput_tokens_per_s")
    mem = d.get("memory_bytes") or {}
    if not isinstance(mem, dict):
        raise UserError(f"{where}: 'memory_bytes' must map device -> bytes")
    return StrategyFigures(
        name=name, applicable=bool(d["applicable"]), reason=d.get("reason"),
        feasible=bool(d.get("feasible", True)),
        throughput_per_s=_num(d, tp_key, where, optional=True),
        usd_per_hour=_num(d, "usd_per_hour", where, optional=True) or 0.0,
        usd_per_million_tokens=_num(d, "usd_per_million_tokens", where, optional=True),
        latency_s=_num(d, "latency_s", where, optional=True),
        memory_bytes={str(k): int(v) for k, v in mem.items()},
        knee_ratio=_num(d["knee"], "ratio", where, optional=True) if isinstance(d.get("knee"), dict) else None,
    )


def parse_cell(d: dict[str, Any], where: str) -> CompareCell:
    if not isinstance(d, dict) or not {"model", "gpus", "strategies"} <= d.keys():
        raise UserError(f"{where}: expected an object with model, gpus and strategies")
    where = f"{where} ({d['model']} on {'+'.join(map(str, d['gpus']))})"
    strategies = {n: parse_strategy(n, s, where) for n, s in d["strategies"].items()}
    images = any(k in s for s in d["strategies"].values() if isinstance(s, dict)
                 for k in ("throughput_images_per_s", "goodput_images_per_s"))
    return CompareCell(
        model=str(d["model"]), gpus=tuple(str(g) for g in d["gpus"]), mode=str(d.get("mode", "throughput")),
        solve_s=_num(d, "solve_s", where, optional=True), bound_ratio=_num(d, "bound_ratio", where, optional=True),
        unit="images/s" if images else "tokens/s",
        strategies={n: strategies[n] for n in strategy_order(list(strategies))},
        reference=_reference(d.get("best_homogeneous_same_budget"), where),
    )


def _reference(d: Any, where: str) -> RentOption | None:
    """`tessera compare`'s best same-size homogeneous deployment: {gpus, goodput, usd_per_hour}."""
    if not isinstance(d, dict) or not d.get("goodput") or not d.get("usd_per_hour"):
        return None
    gpus = tuple(str(g) for g in d.get("gpus", ()))
    return RentOption(label=f"{len(gpus)}×{gpus[0]}" if len(set(gpus)) == 1 else "+".join(gpus), gpus=gpus,
                      usd_per_hour=_num(d, "usd_per_hour", where) or 0.0,
                      goodput_tokens_per_s=_num(d, "goodput", where) or 0.0,
                      source="planner prediction, same-size homogeneous (tessera compare)")


def parse_sim(d: dict[str, Any], label: str, where: str) -> SimRun:
    """A `tessera simulate --json` object (or a `make demo` sims.json entry) with its operating point; every
    latency percentile must be a number (a run that completed nothing has none to draw)."""
    result = SimResult.from_dict(d, where)
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        q = next((q for q, v in getattr(result, key).items() if v is None), None)
        if q is not None:
            raise UserError(f"{where} {key}: field {q!r} must be a number, got None")
    return SimRun(label=label, result=result, **_operating_point(d, where))


def _operating_point(d: dict[str, Any], where: str) -> dict[str, Any]:
    """The run's context: its provenance, and the keys a demo's sims.json records beside the contract."""
    try:
        prov = of_file(d, where)
    except ValueError as e:
        raise UserError(str(e)) from None
    out: dict[str, Any] = {k: _num(d, k, where, optional=True)
                           for k in ("rate_per_s", "capacity_tokens_per_s", "slo_ttft_s", "slo_tpot_s")}
    for k in ("seed", "output_tokens"):
        v = _num(d, k, where, optional=True)
        out[k] = None if v is None else int(v)
    if prov is not None:  # what the simulator was run with, where the provenance records it
        given = {"rate_per_s": prov.rate_per_s, "seed": prov.seed, "slo_ttft_s": prov.slo_ttft_s,
                 "slo_tpot_s": prov.slo_tpot_s,
                 "output_tokens": round(prov.output_per_request) if prov.output_per_request else None}
        out.update({k: v for k, v in given.items() if v is not None})
    return {**out, "provenance": prov}


def sims_of_plan(deployment: Plan | PoolPlan, plan_path: Path | str,
                 sims: tuple[SimRun, ...]) -> tuple[SimRun, ...]:
    """The simulations shown beside ``deployment`` (read from ``plan_path``): each must say it simulated
    this model, and those of this very plan (by fingerprint) are labelled with its strategy, whatever their
    file's label; a run labelled with the plan's strategy (or with no other strategy's name) that simulated
    another plan, or a run that records nothing about what it simulated, is one UserError line."""
    own = fingerprint(deployment)
    out = []
    for s in sims:
        p = s.provenance
        if p is None:
            raise UserError(f"simulation {s.label!r} records no provenance (model, plan, traffic): it cannot be "
                            f"shown beside {plan_path}; simulate again with `tessera simulate {plan_path} --json`")
        if p.model != deployment.model:
            raise UserError(f"simulation {s.label!r} is of {p.model}, not of {deployment.model} ({plan_path}); "
                            f"give a simulation of this plan (`tessera simulate {plan_path} --json`)")
        if p.plan == own:
            out.append(replace(s, label=deployment.strategy))
        elif s.label.split()[-1] in BASELINES and s.label.split()[-1] != deployment.strategy:
            out.append(s)  # another strategy's run on the same traffic (make demo's sims.json)
        else:
            raise UserError(f"simulation {s.label!r} simulated plan {p.plan or 'of unknown fingerprint'}, not "
                            f"{plan_path} ({own}); give a simulation of this plan (`tessera simulate "
                            f"{plan_path} --json`)")
    return tuple(out)


def read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise UserError(f"cannot read {what} file {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{what} file {path} is not JSON: {e.msg} at line {e.lineno}") from None


def load_compare(path: Path) -> tuple[CompareCell, ...]:
    """A `tessera compare` file ({"cells": [...]}, or a plain list of cells), or a `tessera plan --json` object."""
    raw = read_json(path, "compare")
    if isinstance(raw, dict) and isinstance(raw.get("cells"), list):
        raw = raw["cells"]
    cells = [c for c in raw if "error" not in c] if isinstance(raw, list) else [raw]
    if not cells:
        raise UserError(f"compare file {path} holds no cells")
    return tuple(parse_cell(c, f"{path} cell {i}") for i, c in enumerate(cells))


def load_evaluation(path: Path) -> EvalStudy:
    """A `tessera evaluate --json` file: an object with a "cells" list and a "summary" object."""
    raw = read_json(path, "evaluation")
    if not (isinstance(raw, dict) and isinstance(raw.get("cells"), list) and isinstance(raw.get("summary"), dict)):
        raise UserError(f"evaluation file {path} is not `tessera evaluate --json` output "
                        "(needs a \"cells\" list and a \"summary\" object)")
    try:
        return EvalStudy.from_dict(raw)
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"evaluation file {path}: a cell or the summary lacks or mistypes a field ({e}); "
                        "rebuild it with `tessera evaluate --limit 0`") from None


def placement_map_path(folder: Path, stem: str, label: str) -> Path:
    """Where the study's placement map of its ``label`` ("best" / "worst") cell goes: one name for writer and
    reader."""
    return Path(folder) / f"{stem}.{label}_placement.png"


def evaluation_maps(path: Path) -> tuple[tuple[str, Path], ...]:
    """The study's placement maps written beside its JSON (STEM.best_placement.png, STEM.worst_placement.png)."""
    path = Path(path)
    found = ((label, placement_map_path(path.parent, path.stem, label)) for label in ("best", "worst"))
    return tuple((label, png) for label, png in found if png.is_file())


def load_sim(spec: str) -> SimRun:
    """`LABEL=path.json` or `path.json` (label: the file stem, e.g. sim_tessera.json -> tessera)."""
    label, _, path = spec.rpartition("=")
    p = Path(path)
    label = label or p.stem.removeprefix("sim_").removeprefix("sim-")
    return parse_sim(read_json(p, "simulator result"), label, str(p))


def load_sims(spec: str) -> tuple[SimRun, ...]:
    """As load_sim, and also a JSON list of results each with a "label" (what `make demo` writes to sims.json);
    a LABEL= prefix on a list is put before each entry's own label."""
    prefix, _, path = spec.rpartition("=")
    p = Path(path)
    raw = read_json(p, "simulator result")
    if not isinstance(raw, list):
        return (load_sim(spec),)
    if not raw:
        raise UserError(f"simulator result file {p} holds an empty list")
    out = []
    for i, d in enumerate(raw):
        own = d.get("label") if isinstance(d, dict) else None
        label = str(own) if own else f"{p.stem}[{i}]"
        out.append(parse_sim(d, f"{prefix} {label}" if prefix else label, f"{p} entry {i}"))
    return tuple(out)
