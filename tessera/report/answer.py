"""The report's first screen as numbers: what to rent, the goodput and $/M tokens to expect at the stated SLO
and rate, and how sure that is (spread over simulation seeds, distance from saturation), plus the
compare matrix's gains as best / median / worst. Pure functions of ReportData, so tests can check them."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tessera.graph.ir import KernelGraph, Role
from tessera.report.data import CompareCell, RentOption, ReportData, SimResult


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


@dataclass(frozen=True, kw_only=True)
class Answer:
    """The plan's pool, its predicted capacity and the simulated serving at one offered rate."""

    model: str
    gpus: tuple[str, ...]
    strategy: str
    usd_per_hour: float
    capacity_tokens_per_s: float | None  # the planner's predicted goodput at the SLO (saturation)
    rate_per_s: float | None  # offered requests/s in the simulation (same for every seed)
    load: float | None  # offered output tokens/s over capacity
    goodput: Spread | None  # simulated output tokens/s meeting the SLO, over seeds
    usd_per_million_tokens: Spread | None  # $/h over simulated goodput
    attainment: Spread | None  # share of requests meeting the SLO
    slo_ttft_s: float | None
    slo_tpot_s: float | None
    prompt_tokens: int | None
    output_tokens: int | None
    cheaper: RentOption | None  # an alternative with a lower predicted $/M tokens than the pool asked about

    @property
    def predicted_usd_per_million_tokens(self) -> float | None:
        """$/M tokens at the predicted capacity: what the options' figures are compared with."""
        return _usd_per_mtok(self.usd_per_hour, self.capacity_tokens_per_s) if self.capacity_tokens_per_s else None
    worst_ttft_p99_s: float | None  # the highest p99 over seeds
    worst_tpot_p99_s: float | None
    sweep: tuple[tuple[float, float], ...] = ()  # (load, SLO attainment) of the plan's rate sweep, by load

    def saturation(self, met: float = 0.99) -> tuple[float | None, float | None]:
        """(highest swept load where at least ``met`` of requests meet the SLO, lowest load where fewer do)."""
        ok = [ld for ld, a in self.sweep if a >= met]
        bad = [ld for ld, a in self.sweep if a < met]
        return (max(ok) if ok else None, min(bad) if bad else None)


def runs_of(sims: Sequence[SimResult] | None, label: str) -> list[SimResult]:
    return [s for s in sims or () if s.label == label]


def _usd_per_mtok(usd_per_hour: float, tokens_per_s: float) -> float:
    return usd_per_hour / (tokens_per_s * 3600) * 1e6 if tokens_per_s > 0 else float("inf")


def answer_of(data: ReportData) -> Answer | None:
    """None without a plan: the first screen then falls back to the compare matrix alone."""
    plan = data.plan
    if plan is None:
        return None
    runs = runs_of(data.sims, plan.strategy)
    goodputs = [g for g in (s.goodput_tokens_per_s for s in runs) if g is not None]
    capacity = next((s.capacity_tokens_per_s for s in runs if s.capacity_tokens_per_s), None)
    capacity = capacity or plan.throughput_tokens_per_s
    rates = sorted({s.rate_per_s for s in runs if s.rate_per_s is not None})
    loads = [s.load for s in runs if s.load is not None]
    first = runs[0] if runs else None
    slo = plan.slo or {}
    # like with like: the options' figures are the planner's predicted capacities, so is this one
    own_usd_per_mtok = _usd_per_mtok(plan.usd_per_hour, capacity or 0.0)
    cheaper = min((o for o in data.options if o.usd_per_million_tokens < own_usd_per_mtok),
                  key=lambda o: o.usd_per_million_tokens, default=None)
    return Answer(
        model=plan.model, gpus=tuple(d.gpu for d in plan.devices), strategy=plan.strategy,
        usd_per_hour=plan.usd_per_hour, capacity_tokens_per_s=capacity,
        rate_per_s=rates[0] if len(rates) == 1 else None, load=statistics.median(loads) if loads else None,
        goodput=Spread.of(goodputs),
        usd_per_million_tokens=Spread.of([_usd_per_mtok(plan.usd_per_hour, g) for g in goodputs]),
        attainment=Spread.of([s.slo_attainment for s in runs if s.slo_attainment is not None]),
        slo_ttft_s=(first.slo_ttft_s if first else None) or slo.get("ttft_s"),
        slo_tpot_s=(first.slo_tpot_s if first else None) or slo.get("tpot_s"),
        prompt_tokens=plan.workload.get("prompt"), output_tokens=(first.output_tokens if first else None)
        or plan.workload.get("output"), cheaper=cheaper,
        worst_ttft_p99_s=max((s.ttft_s.p99 for s in runs), default=None),
        worst_tpot_p99_s=max((s.tpot_s.p99 for s in runs), default=None),
        sweep=tuple(sorted((s.load, s.slo_attainment) for s in runs_of(data.sweep, plan.strategy)
                           if s.load is not None and s.slo_attainment is not None)),
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
