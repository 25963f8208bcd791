"""Candidate cells of a pool, exact evaluation under the serving model, and an upper bound on each cell.

A cell is the GPUs that serve one model replica. Candidates over some GPU types, with how many of each
there are (``candidate_cells``):
  - a tensor-parallel group of k GPUs of one type, k ∈ {1, 4, 8} (k ≤ the count, ≤ ``cfg.max_tp``): one
    device (k× memory, GEMMs and attention split k ways, all-reduces on the group's link), so every kernel
    runs on it; batch and micro-batch count searched exactly as ``plan_serving`` searches them;
  - a pair, same type or two types: ``plan_serving`` on the pair, and the cell is Tessera's answer
    (``strategies["tessera"]``: the MILP of the mixed iteration, or the baseline it adopts: for a same-type
    pair that may be TP=2 or two replicas, for a mixed pair two independent replicas).

Upper bound on a pair's goodput (so that only cells an optimum could use are planned). Tessera's goodput
is the best of its strategies', so it is bounded by the largest of:
  (i) placements of the mixed iteration (MILP, layer pipeline, attention/FFN): at batch B and m
      micro-batches, any placement's period max(m·T, L) is ≥ P(B, m) = max(m·C, S), where
        C is the optimum of the fractional two-device balance of the kernel times (transfers free,
        memory ignored), a lower bound on T:
          min C  s.t.  Σ_k t[k,a]·y[k] ≤ C,  Σ_k t[k,b]·(1 − y[k]) ≤ C,  0 ≤ y ≤ 1
        solved exactly by ratio order (``balance_two``);
        S is the longest dependency path with every kernel at its faster device's time and transfers
        free (``shortest_latency``), a lower bound on L: the verifier's schedule starts a kernel no
        earlier than the finish of the kernels that last wrote the activations it touches.
      The search only tries B up to the memory ceiling and m in ``cfg.microbatches``; a point meets
      the SLO only if its period ≤ TPOT (for images: steps·period ≤ the image SLO); its goodput is
      B / period (images: B / (steps·period)). So
          bound_i = max over those (B, m) with P within the SLO of B / P   [images: B / (steps·P)];
  (ii) homogeneous at micro-batch count 1: a mixed pair's two replicas are at most the two evaluated
      single-GPU cells (which search m = 1 among others: ``CellPlanner`` requires 1 ∈ cfg.microbatches);
      a same-type pair's are two singles or one TP=2 group, bounded as one device: its period is
      m·Σ kernel times (one device runs them in turn), B up to the group's memory ceiling;
  (iii) prefill/decode (rate-matched, the prefill_decode baseline): O · min(prefill rate of one GPU,
      decode rate of the other), each side bounded alone with one device's step time Σ kernel times: prefill n
      prompts per step with 2·step within the TTFT SLO, decode B sequences with step ≤ TPOT, the KV
      transfer and memory left out (both only lower the rate).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace

import numpy as np

from tessera.contracts.plan import Plan
from tessera.cost import CostModel
from tessera.errors import UserError
from tessera.graph import RESIDENT_ROLES, Role
from tessera.hardware import GpuSpec, best_link
from tessera.plan import (
    BATCHES,
    PlannerConfig,
    Pool,
    Shapes,
    StrategyResult,
    UnitCost,
    batch_ceiling,
    capture_source,
    cell_strategy,
    decode_shape,
    default_cost,
    engine_gpu,
    make_unit,
    model_kind,
    plan_serving,
    prefill_shape,
    resolve_gpu,
    uniform,
)

Cell = tuple[str, ...]  # catalog GPU names, sorted: ("H100-SXM",) * 4, ("H100-SXM", "L40S")
GROUP_SIZES = (1, 4, 8)  # tensor-parallel groups evaluated as one device; 2 is the same-type pair's business


def cell_name(gpus: Cell) -> str:
    if len(gpus) > 1 and len(set(gpus)) == 1:
        return f"{len(gpus)}x{gpus[0]}"
    return "+".join(gpus)


def candidate_cells(counts: dict[str, int], *, max_gpus: int = 8) -> list[Cell]:
    """Same-type groups of k ∈ {1, 4, 8} ≤ count, same-type pairs (count ≥ 2), heterogeneous pairs; names
    sorted so that a cell has one spelling."""
    ts = sorted(counts)
    out: list[Cell] = [(t,) * k for t in ts for k in GROUP_SIZES if k <= min(counts[t], max_gpus)]
    out += [(t, t) for t in ts if counts[t] >= 2 and max_gpus >= 2]
    out += list(itertools.combinations(ts, 2)) if max_gpus >= 2 else []
    return sorted(out, key=lambda c: (len(c), c))


def is_group(gpus: Cell) -> bool:
    """One tensor-parallel group (a single GPU included), as opposed to a pair planned by plan_serving."""
    return len(set(gpus)) == 1 and len(gpus) != 2


@dataclass(frozen=True, kw_only=True)
class CellEval:
    """One candidate cell planned: Tessera's answer (goodput at the SLO, plan) and every strategy's goodput."""

    gpus: Cell
    feasible: bool
    reason: str | None
    goodput_per_s: float  # output tokens/s (images/s) meeting the SLO; 0 when infeasible
    usd_per_hour: float
    plan: Plan | None
    chosen: str | None  # "milp", or the baseline Tessera adopted ("homogeneous", "prefill_decode", ...)
    strategy_goodput: dict[str, float]  # every strategy's goodput (the advisor's comparison groups)
    eval_s: float


def shortest_latency(deps: list[tuple[int, ...]], fastest_s: np.ndarray) -> float:
    """S of the module doc: kernel k starts after every kernel in deps[k]; each runs ``fastest_s[k]``."""
    finish = np.zeros(len(deps))
    for k, ds in enumerate(deps):
        finish[k] = max((finish[d] for d in ds), default=0.0) + fastest_s[k]
    return float(finish.max(initial=0.0))


def activation_deps(g) -> list[tuple[int, ...]]:
    """Per kernel, the kernels whose finish the verifier's schedule waits for: the last writer of each
    non-resident buffer it reads or writes (tessera.plan.solver.verify.evaluate's rule)."""
    writer: dict[int, int] = {}
    out = []
    for k in g.kernels:
        out.append(tuple({writer[b] for b in set(k.reads) | set(k.writes)
                          if b in writer and g.buffers[b].role not in RESIDENT_ROLES}))
        for b in k.writes:
            writer[b] = k.id
    return out


def balance_two(times: np.ndarray) -> float:
    """C* of the fractional two-device balance (module doc): ``times`` [K, 2] seconds. Kernels in order of
    t_a / t_b go to device a first; the optimum is where a's rising load meets b's falling one."""
    if len(times) == 0:
        return 0.0
    t = times[np.argsort(times[:, 0] / np.maximum(times[:, 1], 1e-30), kind="stable")]
    load_a = np.concatenate(([0.0], np.cumsum(t[:, 0])))  # a holds the first i kernels
    load_b = np.concatenate((np.cumsum(t[::-1, 1])[::-1], [0.0]))  # b holds the rest
    i = int(np.searchsorted(load_a - load_b, 0.0))  # first split where a's load ≥ b's
    if i == 0:  # b has no work at all
        return 0.0
    # kernel i−1 is split: a takes fraction y of it; a: load_a[i−1] + y·ta, b: load_b[i] + (1−y)·tb
    ta, tb = t[i - 1]
    lo_a, lo_b = load_a[i - 1], load_b[i]
    y = (lo_b + tb - lo_a) / (ta + tb) if ta + tb > 0 else 0.0
    return float(lo_a + min(1.0, max(0.0, y)) * ta)


class CellPlanner:
    """Plans the cells of one model under one PlannerConfig; caches evaluations and bounds per process (a
    re-plan after a loss and the advisor's several budgets reuse them)."""

    def __init__(self, model: str, cfg: PlannerConfig, *, cost: CostModel | None = None) -> None:
        if 1 not in cfg.microbatches:
            raise ValueError(f"fleet cells need micro-batch count 1 among {cfg.microbatches} (the homogeneous "
                             f"bound, cells.py)")
        self.model, self.cfg = model, cfg
        self.cost = cost or default_cost()
        self.images, self.pd_ok = model_kind(model)
        self.source = capture_source(model)
        self.shapes = Shapes(model, self.source, cfg, self.images)  # shared by every group cell and bound
        self._evals: dict[Cell, CellEval] = {}
        self._bounds: dict[Cell, float] = {}
        self._times: dict[tuple[object, str, int], np.ndarray] = {}
        self._dep_cache: dict[object, list[tuple[int, ...]]] = {}
        self._pd_rates: dict[str, tuple[float, float]] = {}
        self.eval_s = 0.0
        self.bound_s = 0.0

    @staticmethod
    def usd_per_hour(gpus: Cell) -> float:
        return sum(resolve_gpu(g).usd_per_hour for g in gpus)

    def spec(self, name: str) -> GpuSpec:
        """A GPU as the engine may fill it (plan_serving's rule: tessera.plan.pool.engine_gpu)."""
        return engine_gpu(resolve_gpu(name), self.cfg.gpu_memory_utilization)

    def fits(self, gpus: Cell) -> bool:
        """The weights fit the cell's total memory (plan_serving's own first check)."""
        need = sum(b.bytes for b in self.shapes.base.buffers if b.role == Role.WEIGHT)
        return need <= sum(self.spec(g).mem_bytes for g in gpus)

    # ---- exact ---------------------------------------------------------------------------------------------

    def evaluated(self, gpus: Cell) -> bool:
        return gpus in self._evals

    def evaluate(self, gpus: Cell) -> CellEval:
        if gpus not in self._evals:
            t0 = time.perf_counter()
            ev = self._group(gpus) if is_group(gpus) else self._pair(gpus)
            ev = replace(ev, eval_s=time.perf_counter() - t0)
            self.eval_s += ev.eval_s
            self._evals[gpus] = ev
        return self._evals[gpus]

    def _group(self, gpus: Cell) -> CellEval:
        r = self.group_strategy(self.spec(gpus[0]), len(gpus))
        return CellEval(gpus=gpus, feasible=r.feasible, reason=r.reason, goodput_per_s=r.goodput,
                        usd_per_hour=self.usd_per_hour(gpus), plan=r.plan if r.feasible else None,
                        chosen="homogeneous", strategy_goodput={"tessera": r.goodput, "homogeneous": r.goodput},
                        eval_s=0.0)

    def group_strategy(self, spec: GpuSpec, tp: int) -> StrategyResult:
        """One TP group of ``tp`` × ``spec`` as one device, every kernel on it, batch and m searched."""
        if not self.fits((spec.name,) * tp):
            return StrategyResult(name="tessera", applicable=True, reason=f"weights do not fit {tp}x{spec.name}")
        unit = make_unit(spec, tp)
        ucost = UnitCost.over(self.cost, ((spec, tp),))
        # one device: nothing crosses the cell's link; the group's is its best (pairs: plan_serving's rule)
        cell = Pool(gpus=(unit,), link=best_link((spec,) * tp))
        r = cell_strategy("tessera", uniform(0), self.shapes, cell, ucost, self.cfg)
        return replace(r, tp=(tp,))

    def _pair(self, gpus: Cell) -> CellEval:
        usd = self.usd_per_hour(gpus)
        try:
            res = plan_serving(self.model, list(gpus), self.cfg, cost=self.cost, source=self.source)
        except UserError as e:  # nothing fits the pair, or no point meets the SLO
            return CellEval(gpus=gpus, feasible=False, reason=str(e), goodput_per_s=0.0, usd_per_hour=usd,
                            plan=None, chosen=None, strategy_goodput={}, eval_s=0.0)
        o = res.tessera
        every = {n: s.goodput for n, s in res.strategies.items()}
        if o.pool is not None:
            # Tessera's answer is one independent replica per GPU: those are the single-GPU cells (searched
            # over at least the micro-batch counts homogeneous uses), so the pair adds nothing of its own.
            return CellEval(gpus=gpus, feasible=False, reason="Tessera's answer is one replica per GPU (the "
                            "single-GPU cells)", goodput_per_s=0.0, usd_per_hour=usd, plan=None, chosen=o.chosen,
                            strategy_goodput={**every, "tessera": 0.0}, eval_s=0.0)
        return CellEval(gpus=gpus, feasible=o.feasible, reason=o.reason, goodput_per_s=o.goodput, usd_per_hour=usd,
                        plan=o.plan if o.feasible else None, chosen=o.chosen, strategy_goodput=every, eval_s=0.0)

    # ---- bound ---------------------------------------------------------------------------------------------

    def upper_bound(self, gpus: Cell) -> float:
        """Goodput (per s) no plan of this cell exceeds; exact for a group; 0 when the weights do not fit."""
        if gpus not in self._bounds:
            if is_group(gpus) or self.evaluated(gpus):
                ub = self.evaluate(gpus).goodput_per_s
            elif not self.fits(gpus):
                ub = 0.0
            else:
                t0 = time.perf_counter()
                ub = max(self._placement_bound(gpus), self._homogeneous_bound(gpus), self._pd_bound(gpus))
                self.bound_s += time.perf_counter() - t0
            self._bounds[gpus] = ub
        return self._bounds[gpus]

    def bound_checks(self) -> list[tuple[Cell, float, float]]:
        """(pair, its bound, its best strategy's goodput) for every pair both bounded and planned so far."""
        return [(c, b, max(e.strategy_goodput.values(), default=0.0)) for c, b in self._bounds.items()
                if not is_group(c) and (e := self._evals.get(c)) is not None]

    def _placement_bound(self, gpus: Cell) -> float:
        """Term (i) of the module doc."""
        specs = tuple(self.spec(g) for g in gpus)
        top = batch_ceiling(self.shapes.base, specs, self.cfg.traffic, self.images, self.cfg.batch_cap)
        best = 0.0
        for m in self.cfg.microbatches:
            for b in (x for x in BATCHES if m <= x <= top):
                shape = self.shapes.shape(b, m)
                times = np.stack([self._kernel_times(shape, s) for s in specs], axis=1)
                period = max(m * balance_two(times), shortest_latency(self._deps(shape), times.min(axis=1)))
                best = max(best, self._goodput_if_slo(b, period))
        return best

    def _goodput_if_slo(self, batch: int, period_s: float) -> float:
        """B / period (images: B / (steps·period)) when the period meets the SLO's TPOT (image latency)."""
        if period_s <= 0:
            return 0.0
        if self.images:
            lat = self.cfg.traffic.steps * period_s
            return batch / lat if lat <= self.cfg.slo.image_s else 0.0
        return batch / period_s if period_s <= self.cfg.slo.tpot_s else 0.0

    def _kernel_times(self, shape: object, spec: GpuSpec, tp: int = 1) -> np.ndarray:
        """Seconds of every kernel of the graph at ``shape`` on one GPU or a TP group of ``tp``."""
        key = (shape, spec.name, tp)
        if key not in self._times:
            g = self.shapes.at(shape)  # type: ignore[arg-type]
            cost, unit = (self.cost, spec) if tp == 1 else (UnitCost.over(self.cost, ((spec, tp),)), make_unit(spec, tp))
            self._times[key] = np.array([cost.kernel_time_s(k, unit) for k in g.kernels])
        return self._times[key]

    def _deps(self, shape: object) -> list[tuple[int, ...]]:
        if shape not in self._dep_cache:
            self._dep_cache[shape] = activation_deps(self.shapes.at(shape))  # type: ignore[arg-type]
        return self._dep_cache[shape]

    def _homogeneous_bound(self, gpus: Cell) -> float:
        """Term (ii): a mixed pair's two replicas; a same-type pair's two replicas or its TP=2 group (bounded
        as one device: its period is m·Σ kernel times, batch up to its memory ceiling)."""
        if gpus[0] != gpus[1]:
            return sum(self.evaluate((g,)).goodput_per_s for g in gpus)
        spec = self.spec(gpus[0])
        top = batch_ceiling(self.shapes.base, (make_unit(spec, 2),), self.cfg.traffic, self.images,
                            self.cfg.batch_cap)
        tp2 = max((self._goodput_if_slo(b, m * self._kernel_times(self.shapes.shape(b, m), spec, 2).sum())
                   for m in self.cfg.microbatches for b in BATCHES if m <= b <= top), default=0.0)
        return max(2 * self.evaluate(gpus[:1]).goodput_per_s, tp2)

    def _pd_bound(self, gpus: Cell) -> float:
        """Term (iii): O · max over orientations of min(prefill rate of one GPU, decode rate of the other)."""
        if not self.pd_ok:
            return 0.0
        a, b = (self.spec(g) for g in gpus)
        o = self.cfg.traffic.output
        return o * max(min(self._prefill_rate(a), self._decode_rate(b)), min(self._prefill_rate(b), self._decode_rate(a)))

    def _prefill_rate(self, spec: GpuSpec) -> float:
        """Requests/s a GPU prefills alone, at most: n prompts per step of s seconds (one device: the sum of
        kernel times), 2·s within the TTFT SLO (the transfer and memory left out: looser)."""
        if spec.name not in self._pd_rates:
            self._pd_rates[spec.name] = self._pd_sides(spec)
        return self._pd_rates[spec.name][0]

    def _decode_rate(self, spec: GpuSpec) -> float:
        if spec.name not in self._pd_rates:
            self._pd_rates[spec.name] = self._pd_sides(spec)
        return self._pd_rates[spec.name][1]

    def _pd_sides(self, spec: GpuSpec) -> tuple[float, float]:
        t, slo, cap = self.cfg.traffic, self.cfg.slo, self.cfg.batch_cap
        pre = 0.0
        for n in (x for x in BATCHES if not cap or x <= cap):
            s = self._kernel_times(prefill_shape(n, t), spec).sum()
            if 0 < s and 2 * s <= slo.ttft_s:
                pre = max(pre, n / s)
        top = batch_ceiling(self.shapes.base, (spec,), t, False, cap)
        dec = 0.0
        for b in (x for x in BATCHES if x <= top):
            s = self._kernel_times(decode_shape(b, t), spec).sum()
            if 0 < s <= slo.tpot_s:
                dec = max(dec, b / (t.output * s))
        return pre, dec
