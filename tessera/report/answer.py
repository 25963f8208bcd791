"""The report's first screen as numbers: what to rent, the goodput and $/M tokens to expect at the stated SLO
and rate, and how sure that is (spread over simulation seeds, distance from saturation), plus the
compare matrix's gains as best / median / worst. Pure functions of ReportData, so tests can check them."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tessera.contracts.ir import KernelGraph, Role
from tessera.contracts.plan import Plan, PoolPlan
from tessera.report.agreement import TOLERANCE
from tessera.report.data import CompareCell, CostAccuracy, RentOption, ReportData, SimRun


@dataclass(frozen=True, kw_only=True)
class Spread:
    """A figure over simulation seeds: lowest, median, highest, and how many seeds."""

    lo: float
    mid: float
    hi: float
    n: int

    def __post_init__(self) -> None:
        if not (self.lo <= self.mid <= self.hi and self.n >= 1):
            raise ValueError(f"spread lo={self.lo} mid={self.mid} hi={self.hi} n={self.n}: need lo <= mid <= hi, n >= 1")

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        vals = sorted(values)
        return cls(lo=vals[0], mid=statistics.median(vals), hi=vals[-1], n=len(vals)) if vals else None

    @property
    def rel_half_width(self) -> float:
        """Half the range over the median: 0.03 reads as ±3 %."""
        return (self.hi - self.lo) / 2 / self.mid if self.mid else 0.0


@dataclass(frozen=True, kw_only=True)
class Gain:
    """One ratio over the compare matrix, with the cells where it is best and worst."""

    best: float
    best_cell: str
    median: float
    worst: float
    worst_cell: str
    cells: int


# The runtime (tessera.runtime, tessera.engine) runs on the CPU and on CUDA devices (PyTorch's CUDA build,
# NCCL between workers; the PTX analyser reads NVIDIA PTX): of the catalog, NVIDIA GPUs. An option on
# another vendor's GPUs (AMD's MI300X, Intel's Arc) is planned from transferred costs and cannot be run here.
RUNTIME_VENDORS = ("nvidia",)


def runtime_covers(data: ReportData, gpu_name: str) -> bool:
    """Whether Tessera's runtime can run a plan on this catalog GPU (RUNTIME_VENDORS)."""
    facts = data.gpu(gpu_name)
    return facts is not None and facts.vendor in RUNTIME_VENDORS


@dataclass(frozen=True, kw_only=True)
class KneeGap:
    """The planner–simulator check (tessera.report.agreement, run by `tessera compare`): the simulator's SLO
    knee over the planner's goodput for this deployment's cell of the matrix (None: not in it), and over
    every checked strategy of the matrix: how many within ``tolerance``, lowest, median and highest."""

    own: float | None
    checked: int
    within: int
    tolerance: float
    lo: float
    median: float
    hi: float


@dataclass(frozen=True, kw_only=True)
class Answer:
    """The plan's deployment: one capacity (the planner's goodput at the SLO) and one price (its $/h over
    that capacity), the simulated serving at one offered rate that checks it, how sure, and what else to
    rent."""

    model: str
    gpus: tuple[str, ...]  # every GPU the deployment rents
    strategy: str
    how: str  # how the deployment serves, in words (placement_words)
    usd_per_hour: float
    capacity_tokens_per_s: float | None  # the planner's predicted goodput at the SLO (saturation)
    rate_per_s: float | None  # offered requests/s in the simulation (same for every seed)
    load: float | None  # offered output tokens/s over capacity
    goodput: Spread | None  # simulated output tokens/s meeting the SLO, over seeds
    attainment: Spread | None  # share of requests meeting the SLO
    slo_ttft_s: float | None
    slo_tpot_s: float | None
    prompt: str | None  # tokens per request, as the plan or the runs record them ("1024", "4-16", a trace)
    output: str | None
    cheaper: RentOption | None  # the option with the lowest predicted $/M tokens, below this deployment's
    homogeneous: RentOption | None  # the best option of one GPU type (lowest predicted $/M tokens)
    left_out: tuple[str, ...]  # options' GPUs the runtime does not run (their options are not proposed)
    best_baseline: tuple[str, float] | None  # (name, predicted goodput) of the best baseline on these GPUs
    knee: KneeGap | None
    cost_accuracy: CostAccuracy | None
    worst_ttft_p99_s: float | None  # the highest p99 over seeds
    worst_tpot_p99_s: float | None
    sweep: tuple[tuple[float, float], ...] = ()  # (load, SLO attainment) of the plan's rate sweep, by load
    cost_sources: tuple[tuple[str, str], ...] = ()  # (GPU, where its kernel costs come from) of the GPUs named

    def cost_source(self, gpu_name: str) -> str:
        return dict(self.cost_sources).get(gpu_name, "not in the catalog")

    @property
    def predicted_usd_per_million_tokens(self) -> float | None:
        """The one price: $/h over the predicted capacity, like the options' figures."""
        return _usd_per_mtok(self.usd_per_hour, self.capacity_tokens_per_s) if self.capacity_tokens_per_s else None

    @property
    def edge(self) -> float | None:
        """This deployment's capacity over the best baseline's on the same GPUs."""
        if self.best_baseline is None or not self.capacity_tokens_per_s or self.best_baseline[1] <= 0:
            return None
        return self.capacity_tokens_per_s / self.best_baseline[1]

    @property
    def error_band(self) -> float | None:
        """How far apart two predictions must be to be told apart: the larger of the cost model's median
        error on kernel times and this deployment's planner–simulator gap (None: neither known)."""
        parts = [self.cost_accuracy.unseen_median] if self.cost_accuracy else []
        if self.knee is not None and self.knee.own is not None:
            parts.append(abs(self.knee.own - 1))
        return max(parts) if parts else None

    def saturation(self, met: float = 0.99) -> tuple[float | None, float | None]:
        """(highest swept load where at least ``met`` of requests meet the SLO, lowest load where fewer do)."""
        ok = [ld for ld, a in self.sweep if a >= met]
        bad = [ld for ld, a in self.sweep if a < met]
        return (max(ok) if ok else None, min(bad) if bad else None)


def runs_of(sims: Sequence[SimRun] | None, label: str) -> list[SimRun]:
    return [s for s in sims or () if s.label == label]


def _usd_per_mtok(usd_per_hour: float, tokens_per_s: float) -> float:
    return usd_per_hour / (tokens_per_s * 3600) * 1e6 if tokens_per_s > 0 else float("inf")


def deployment_gpus(d: Plan | PoolPlan) -> tuple[str, ...]:
    """Every GPU a deployment rents: each cell's devices × count × replicas."""
    cells = [(c.plan, c.count) for c in d.cells] if isinstance(d, PoolPlan) else [(d, 1)]
    return tuple(dev.gpu for p, n in cells for _ in range(n * p.replicas) for dev in p.devices)


def placement_words(d: Plan | PoolPlan) -> str:
    """How the deployment serves, in a reader's words: a plan whose every cell is one GPU runs whole-model
    replicas behind a router whatever strategy produced it (Tessera's answer is then no split at all)."""
    plans = [c.plan for c in d.cells] if isinstance(d, PoolPlan) else [d]
    if all(len(p.devices) == 1 for p in plans):
        return "one whole-model replica per GPU behind a router (no kernel split)"
    return "Tessera's kernel placement" if d.strategy == "tessera" else f"the {d.strategy} plan"


def capacity_of(data: ReportData, runs: Sequence[SimRun]) -> float | None:
    """The one capacity: the planner's goodput at the SLO (all cells and replicas); a plan file without one
    (written before goodput was planned) falls back on what its runs recorded, then on its throughput."""
    if data.goodput_per_s:
        return data.goodput_per_s
    recorded = next((s.capacity_tokens_per_s for s in runs if s.capacity_tokens_per_s), None)
    return recorded or data.capacity_per_s


def _options(data: ReportData, model: str, own_usd_per_mtok: float) -> tuple[RentOption | None,
                                                                              RentOption | None, tuple[str, ...]]:
    """(cheapest option below ``own_usd_per_mtok``, best one-type option, GPUs left out) among the options
    (``data.options`` and the compare matrix's same-size homogeneous pools for this model) whose every GPU
    the runtime runs."""
    refs = [c.reference for c in data.compare or () if c.model == model and c.reference is not None]
    every = list({(o.label, o.usd_per_hour, o.goodput_tokens_per_s): o for o in (*data.options, *refs)}.values())
    ok = [o for o in every if all(runtime_covers(data, g) for g in o.gpus)]
    left_out = tuple(sorted({g for o in every for g in o.gpus if not runtime_covers(data, g)}))
    cheaper = min((o for o in ok if o.usd_per_million_tokens < own_usd_per_mtok),
                  key=lambda o: o.usd_per_million_tokens, default=None)
    homog = min((o for o in ok if len(set(o.gpus)) == 1), key=lambda o: o.usd_per_million_tokens, default=None)
    return cheaper, homog, left_out


def _best_baseline(data: ReportData, model: str, gpus: tuple[str, ...]) -> tuple[str, float] | None:
    """The best other strategy on the same GPUs: from the same planning run (``baseline_plans``) when given,
    else from the compare matrix's cell for this model and GPUs."""
    if data.baseline_goodputs:
        return max(data.baseline_goodputs, key=lambda x: x[1])
    cell = matrix_cell(data.compare, model, gpus)
    b = cell.best_baseline() if cell is not None else None
    return (b.name, b.throughput_per_s or 0.0) if b is not None and b.throughput_per_s else None


def matrix_cell(cells: Sequence[CompareCell] | None, model: str, gpus: tuple[str, ...]) -> CompareCell | None:
    return next((c for c in cells or () if c.model == model and sorted(c.gpus) == sorted(gpus)), None)


def knee_gap(cells: Sequence[CompareCell] | None, model: str, gpus: tuple[str, ...]) -> KneeGap | None:
    """The matrix's planner–simulator check, and this deployment's cell's (Tessera's strategy) where it has one."""
    ratios = [r.knee_ratio for c in cells or () for n, r in c.strategies.items()
              if n != "tessera" and r.knee_ratio is not None]
    if not ratios:
        return None
    cell = matrix_cell(cells, model, gpus)
    t = cell.strategies.get("tessera") if cell is not None else None
    ratios.sort()
    return KneeGap(own=t.knee_ratio if t is not None else None, checked=len(ratios),
                   within=sum(1 for r in ratios if abs(r - 1) <= TOLERANCE), tolerance=TOLERANCE,
                   lo=ratios[0], median=statistics.median(ratios), hi=ratios[-1])


def answer_of(data: ReportData) -> Answer | None:
    """None without a plan: the first screen then falls back to the compare matrix alone."""
    d = data.deployment
    if d is None:
        return None
    runs = runs_of(data.sims, d.strategy)
    goodputs = [g for g in (s.goodput_tokens_per_s for s in runs) if g is not None]
    capacity = capacity_of(data, runs)
    gpus = deployment_gpus(d)
    usd = d.usd_per_hour
    rates = sorted({s.rate_per_s for s in runs if s.rate_per_s is not None})
    loads = [s.offered_tokens_per_s / capacity for s in runs if s.offered_tokens_per_s is not None and capacity]
    first = runs[0] if runs else None
    lead = d.lead if isinstance(d, PoolPlan) else d
    slo, work = lead.slo, lead.workload
    prov = first.provenance if first is not None else None
    cheaper, homog, left_out = _options(data, d.model, _usd_per_mtok(usd, capacity or 0.0))
    return Answer(
        model=d.model, gpus=gpus, strategy=d.strategy, how=placement_words(d), usd_per_hour=usd, capacity_tokens_per_s=capacity,
        rate_per_s=rates[0] if len(rates) == 1 else None, load=statistics.median(loads) if loads else None,
        goodput=Spread.of(goodputs),
        attainment=Spread.of([s.result.slo_attainment for s in runs if s.result.slo_attainment is not None]),
        slo_ttft_s=(first.slo_ttft_s if first else None) or slo.ttft_s,
        slo_tpot_s=(first.slo_tpot_s if first else None) or slo.tpot_s,
        prompt=prov.prompt if prov else (str(work.prompt) if work.prompt else None),
        output=prov.output if prov else (str(work.output) if work.output else None),
        cheaper=cheaper, homogeneous=homog, left_out=left_out,
        best_baseline=_best_baseline(data, d.model, gpus), knee=knee_gap(data.compare, d.model, gpus),
        cost_accuracy=data.cost_accuracy, cost_sources=tuple((g.name, g.cost_source) for g in data.gpu_facts),
        worst_ttft_p99_s=max((s.result.ttft_s["p99"] for s in runs), default=None),
        worst_tpot_p99_s=max((s.result.tpot_s["p99"] for s in runs), default=None),
        sweep=tuple(sorted((s.offered_tokens_per_s / capacity, s.result.slo_attainment)
                           for s in runs_of(data.sweep, d.strategy)
                           if s.offered_tokens_per_s is not None and capacity and s.result.slo_attainment is not None)),
    )


def gain_over(cells: Sequence[CompareCell], ratio: Callable[[CompareCell], float | None]) -> Gain | None:
    """Best, median and worst of ``ratio`` over the cells where it is defined."""
    scored = [(r, c) for c in cells if (r := ratio(c)) is not None]
    if not scored:
        return None
    best = max(scored, key=lambda rc: rc[0])
    worst = min(scored, key=lambda rc: rc[0])
    return Gain(best=best[0], best_cell=f"{best[1].model} on {best[1].pool}", worst=worst[0],
                worst_cell=f"{worst[1].model} on {worst[1].pool}",
                median=statistics.median(r for r, _ in scored), cells=len(scored))


def matrix_gains(cells: Sequence[CompareCell] | None) -> dict[str, Gain]:
    """Tessera over the best baseline in the same pool (goodput), and over the best same-size homogeneous
    deployment (goodput per dollar), each only where defined."""
    out = {}
    for name, fn in (("goodput vs best baseline, same GPUs", CompareCell.speedup),
                     ("goodput per $ vs best same-size homogeneous", CompareCell.per_dollar_gain)):
        g = gain_over(cells or (), fn)
        if g is not None:
            out[name] = g
    return out


@dataclass(frozen=True, kw_only=True)
class WeightCopies:
    """Weights of one placement: the model's own bytes, and the extra copies where the kernels touching one
    weight run on more than one device (each of those devices holds it)."""

    unique_bytes: int  # every weight buffer once
    held_bytes: tuple[int, ...]  # per device: weight buffers its kernels touch
    shared_bytes: int  # bytes held by two or more devices, counted once

    @property
    def duplicated_bytes(self) -> int:
        return sum(self.held_bytes) - self.unique_bytes


def weight_copies(graph: KernelGraph, assignment: Sequence[int], devices: int) -> WeightCopies:
    """Which device holds which weight: a weight is resident on every device that runs a kernel reading or
    writing it (the planner's memory rule)."""
    holders: dict[int, set[int]] = {}
    weights = {b.id: b.bytes for b in graph.buffers if b.role == Role.WEIGHT}
    for k in graph.kernels:
        for b in (*k.reads, *k.writes):
            if b in weights:
                holders.setdefault(b, set()).add(int(assignment[k.id]))
    held = [0] * devices
    for b, devs in holders.items():
        for d in devs:
            held[d] += weights[b]
    return WeightCopies(unique_bytes=sum(weights[b] for b in holders), held_bytes=tuple(held),
                        shared_bytes=sum(weights[b] for b, devs in holders.items() if len(devs) > 1))
