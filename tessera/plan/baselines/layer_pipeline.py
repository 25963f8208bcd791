"""Layer pipeline: contiguous layer ranges, one per device, in every device order, with asynchronous
micro-batches; the split searched by memory and speed.

At a given (batch, m) the split that serves best is the one with the shortest period that fits memory:
memory is a constraint there (the batch's KV is part of it), and the search over batches
(serving.search, from the largest batch down) reaches a larger batch exactly when some split still fits
its KV, so minimising the period subject to memory at every (batch, m) is what lets a split leave KV room
where it raises the batch. For each device order ``best_split`` finds that split exactly under a
per-layer model of the verifier (``LayerCosts``): the period of a chain of stages is max(m·B, S), B the
busiest stage or cut (compute seconds, seconds of the values crossing into it) and S one micro-batch's
path, the sum of them all; for each cap τ on B a dynamic program over (stage, layers used) finds the
smallest S with every stage within τ and fitting its device, and since S*(τ) falls as τ grows a binary
search over the candidate τ (every stage's and cut's seconds) finds the τ where max(m·τ, S*(τ)) is
least. The best orders' splits, and the speed-proportional split, are then scored by the verifier.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from tessera.contracts.cost import KernelCosts
from tessera.graph import KernelGraph, Role
from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan.baselines.common import best_fitting

_RESIDENT = (Role.WEIGHT, Role.KV, Role.STATE)
MAX_ORDERS = 24  # device orders searched; beyond, each GPU type's devices stay together (orders of types)
VERIFIED_ORDERS = 4  # the orders whose best splits the verifier scores


def layer_units(g: KernelGraph) -> tuple[list[int], int]:
    """(unit of each kernel, number of units): unit i is the i-th layer in program order; a kernel outside
    the layers joins the next layer's unit (the embedding, a vision tower's merger), or the last one's
    after the last layer (final norm, LM head). A graph without layers is one unit."""
    order: dict[int, int] = {}
    for k in g.kernels:
        if k.layer is not None and k.layer not in order:
            order[k.layer] = len(order)
    n = max(1, len(order))
    out: list[int] = []
    pending = 0
    for k in g.kernels:
        if k.layer is None:
            pending += 1
            continue
        out.extend([order[k.layer]] * (pending + 1))
        pending = 0
    out.extend([n - 1] * pending)
    return out, n


def layer_ranges(n_layers: int, speeds: list[float]) -> list[int]:
    """Layer counts per stage in proportion to speed (largest remainder), every stage at least one layer
    when there are enough layers."""
    tot = sum(speeds)
    raw = [n_layers * s / tot for s in speeds]
    cnt = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - cnt[i], reverse=True)[: n_layers - sum(cnt)]:
        cnt[i] += 1
    if n_layers >= len(speeds):
        for i in range(len(cnt)):
            if cnt[i] == 0:
                j = max(range(len(cnt)), key=lambda j: cnt[j])
                cnt[j] -= 1
                cnt[i] += 1
    return cnt


def layer_pipeline(g: KernelGraph, order: list[int], counts: list[int]) -> tuple[int, ...]:
    """Contiguous layer ranges: stage i (device order[i]) runs the next counts[i] layer units
    (layer_units: the prologue with the first layer, the epilogue with the last)."""
    unit, _ = layer_units(g)
    stage_of: list[int] = []
    for st, c in enumerate(counts):
        stage_of.extend([order[st]] * c)
    return tuple(stage_of[u] for u in unit)


def layer_seconds(g: KernelGraph, times: list[list[float]]) -> list[float]:
    """Per-device seconds of all layers' kernels (times[k][d]); speed of a stage is 1 / this."""
    n_dev = len(times[0]) if times else 0
    return [sum(times[k.id][d] for k in g.kernels if k.layer is not None) for d in range(n_dev)]


@dataclass(frozen=True, kw_only=True, eq=False)
class LayerCosts:
    """A graph's layer units (layer_units) as the split search sees them, per micro-batch:
    ``seconds`` [n, D] compute of each unit on each device; ``weight_bytes`` and ``kv_bytes`` [n] resident
    bytes its kernels touch (kv: KV and recurrent state, held once per micro-batch in flight); ``act_bytes``
    [n] an upper bound on the live activations while it runs (the live set with every kernel on one
    device, which contains any device's own); ``cut_s`` [n + 1] seconds of the values crossing a cut just
    before unit i, each sent once per cut (0 at both ends)."""

    seconds: np.ndarray = field(repr=False)
    weight_bytes: np.ndarray = field(repr=False)
    kv_bytes: np.ndarray = field(repr=False)
    act_bytes: np.ndarray = field(repr=False)
    cut_s: np.ndarray = field(repr=False)

    @property
    def n(self) -> int:
        return len(self.weight_bytes)


def layer_costs(g: KernelGraph, units: tuple[GpuSpec, ...], link: LinkSpec, cost: KernelCosts) -> LayerCosts:
    unit, n = layer_units(g)
    secs = np.zeros((n, len(units)))
    for k in g.kernels:
        secs[unit[k.id]] += [cost.kernel_time_s(k, u) for u in units]
    held: set[tuple[int, int]] = set()  # (unit, resident buffer) pairs: each counted once per unit
    for k in g.kernels:
        held.update((unit[k.id], b) for b in (*k.reads, *k.writes) if g.buffers[b].role in _RESIDENT)
    weight, kv = np.zeros(n), np.zeros(n)
    for u, b in held:
        (weight if g.buffers[b].role == Role.WEIGHT else kv)[u] += g.buffers[b].bytes
    return LayerCosts(seconds=secs, weight_bytes=weight, kv_bytes=kv, act_bytes=_live_peaks(g, unit, n),
                      cut_s=_cut_seconds(g, unit, n, link, cost))


def _live_peaks(g: KernelGraph, unit: list[int], n: int) -> np.ndarray:
    """Per unit, the most activation bytes live at one of its kernels with every kernel on one device (a
    buffer lives from its first to its last touch, as the verifier counts a device's own)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k in g.kernels:
        for b in (*k.reads, *k.writes):
            if g.buffers[b].role not in _RESIDENT:
                first.setdefault(b, k.id)
                last[b] = k.id
    delta = np.zeros(len(g.kernels) + 1)
    for b, s in first.items():
        delta[s] += g.buffers[b].bytes
        delta[last[b] + 1] -= g.buffers[b].bytes
    live = np.cumsum(delta)[:-1]
    peak = np.zeros(n)
    np.maximum.at(peak, np.asarray(unit, dtype=int), live)
    return peak


def _cut_seconds(g: KernelGraph, unit: list[int], n: int, link: LinkSpec, cost: KernelCosts) -> np.ndarray:
    """Per cut before unit i, the seconds of the values written before it and used at or after it: each
    (writer, buffer) value used by a later unit crosses every cut up to its last user (as the verifier
    reads it: one send per value and destination)."""
    writer: dict[int, int] = {}
    reach: dict[tuple[int, int], int] = {}  # (writer kernel, buffer) -> last unit that uses it
    for k in g.kernels:
        for b in set(k.reads) | set(k.writes):
            w = writer.get(b)
            if w is not None and g.buffers[b].role not in _RESIDENT and unit[w] < unit[k.id]:
                reach[w, b] = max(reach.get((w, b), 0), unit[k.id])
        for b in k.writes:
            writer[b] = k.id
    diff = np.zeros(n + 2)
    for (w, b), last in reach.items():
        t = cost.transfer_time_s(g.buffers[b].bytes, link)
        diff[unit[w] + 1] += t
        diff[last + 1] -= t
    cut = np.cumsum(diff)[: n + 1]
    cut[0] = 0.0
    return cut


@dataclass(frozen=True, kw_only=True)
class Split:
    """One order's best split under the LayerCosts model: layer units per stage, its modelled period
    max(m·B, S), B (busiest stage or cut) and S (the sum)."""

    order: tuple[int, ...]
    counts: tuple[int, ...]
    period_s: float
    bottleneck_s: float
    path_s: float


def stage_matrices(c: LayerCosts, order: tuple[int, ...], mem_bytes: tuple[int, ...], m: int
                   ) -> list[np.ndarray]:
    """Per stage, seconds of units [i, j) on its device as an (n+1)×(n+1) matrix, inf where i ≥ j or the
    range does not fit the device: weights + m × KV + peak activations."""
    n = c.n
    idx = np.arange(n + 1)
    upper = idx[:, None] < idx[None, :]
    wc = np.concatenate([[0.0], np.cumsum(c.weight_bytes)])
    kc = np.concatenate([[0.0], np.cumsum(c.kv_bytes)])
    act = np.zeros((n + 1, n + 1))
    for i in range(n):
        act[i, i + 1:] = np.maximum.accumulate(c.act_bytes[i:])
    need = (wc[None, :] - wc[:, None]) + m * (kc[None, :] - kc[:, None]) + act
    out = []
    for d in order:
        p = np.concatenate([[0.0], np.cumsum(c.seconds[:, d])])
        t = p[None, :] - p[:, None]
        out.append(np.where(upper & (need <= mem_bytes[d]), t, np.inf))
    return out


def _dp(stages: list[np.ndarray], cut: np.ndarray, tau: float) -> tuple[float, list[np.ndarray]]:
    """Smallest S (stage seconds plus cut seconds) over splits whose every stage and cut is within tau,
    and the argmin per stage for backtracking. f[j]: best S with units [0, j) on the stages so far."""
    inf = np.inf
    n1 = stages[0].shape[0]
    f = np.where(stages[0][0] <= tau, stages[0][0], inf)
    arg = []
    entry = np.where(cut <= tau, cut, inf)  # cut before unit i, paid by the stage starting at i
    for t in stages[1:]:
        tot = f[:, None] + entry[:, None] + np.where(t <= tau, t, inf)
        a = np.argmin(tot, axis=0)
        arg.append(a)
        f = tot[a, np.arange(n1)]
    return float(f[-1]), arg


def best_split(c: LayerCosts, order: tuple[int, ...], mem_bytes: tuple[int, ...], m: int) -> Split | None:
    """The contiguous split over ``order`` (every stage at least one unit) with the least modelled period
    that fits memory (module doc); None when none fits or there are fewer units than stages."""
    n, k = c.n, len(order)
    if n < k:
        return None
    stages = stage_matrices(c, order, mem_bytes, m)
    cut = c.cut_s.copy()
    # candidate caps: every stage's seconds a split can give it (the first stage starts at unit 0, the
    # last ends at unit n) and every cut's
    reach = [stages[0][0]] + [s.ravel() for s in stages[1:-1]] + ([stages[-1][:, n]] if k > 1 else [])
    taus = np.unique(np.concatenate([*(r[np.isfinite(r)] for r in reach), cut[1:n]]))
    if not len(taus) or not math.isfinite(_dp(stages, cut, taus[-1])[0]):
        return None

    def gap(i: int) -> float:  # m·τ − S*(τ): rises with τ
        return m * taus[i] - _dp(stages, cut, taus[i])[0]

    lo, hi = 0, len(taus) - 1  # first index with gap >= 0 (hi stays the last when none has)
    if gap(hi) >= 0:
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if gap(mid) < 0 else (lo, mid)
    picks = [_backtrack(stages, cut, taus[i], order, m) for i in {hi, max(0, hi - 1)}]
    return min((p for p in picks if p is not None), key=lambda p: (p.period_s, p.path_s), default=None)


def _backtrack(stages: list[np.ndarray], cut: np.ndarray, tau: float, order: tuple[int, ...],
               m: int) -> Split | None:
    s_sum, arg = _dp(stages, cut, tau)
    if not math.isfinite(s_sum):
        return None
    j = stages[0].shape[0] - 1
    bounds = [j]
    for a in reversed(arg):
        j = int(a[j])
        bounds.append(j)
    bounds.append(0)
    bounds.reverse()
    counts = tuple(b - a for a, b in zip(bounds, bounds[1:], strict=False))
    terms = [float(s[a, b]) for s, a, b in zip(stages, bounds, bounds[1:], strict=False)]
    terms += [float(cut[b]) for b in bounds[1:-1]]
    return Split(order=order, counts=counts, period_s=max(m * max(terms), sum(terms)),
                 bottleneck_s=max(terms), path_s=sum(terms))


def device_orders(units: tuple[GpuSpec, ...]) -> list[tuple[int, ...]]:
    """Device orders that differ (devices of one GPU type are interchangeable): every distinct sequence of
    types when there are at most MAX_ORDERS, else each type's devices together in every order of the types
    (the first MAX_ORDERS of them)."""
    names = [u.name for u in units]
    types = list(dict.fromkeys(names))
    count = math.factorial(len(names)) // math.prod(math.factorial(names.count(t)) for t in types)
    if count <= MAX_ORDERS:
        seqs = list(dict.fromkeys(itertools.permutations(names)))
    else:
        seqs = [tuple(t for t in p for _ in range(names.count(t)))
                for p in itertools.islice(itertools.permutations(types), MAX_ORDERS)]
    out = []
    for seq in seqs:
        free = {t: [i for i, n in enumerate(names) if n == t] for t in types}
        out.append(tuple(free[t].pop(0) for t in seq))
    return out


def best_splits(c: LayerCosts, orders: list[tuple[int, ...]], mem_bytes: tuple[int, ...], m: int) -> list[Split]:
    """Each order's best split (best_split), the VERIFIED_ORDERS best first."""
    splits = [s for o in orders if (s := best_split(c, o, mem_bytes, m)) is not None]
    return sorted(splits, key=lambda s: (s.period_s, s.path_s))[:VERIFIED_ORDERS]


def rule(units: tuple[GpuSpec, ...], link: LinkSpec, cost: KernelCosts) -> Callable:
    """The placement rule (graph, batch, m) -> assignment: the best orders' splits (best_splits) and their
    speed-proportional splits, scored by the verifier. Where no split fits under the model the activations
    are taken at 0 (the model's weights and KV are the verifier's, its activations an upper bound), and
    where none fits even so, None: no contiguous split fits at this batch. A graph with fewer layers than
    devices gets the speed-proportional split, some devices idle."""
    mem = tuple(u.mem_bytes for u in units)
    orders = device_orders(units)

    def place(g: KernelGraph, b: int, m: int) -> tuple[int, ...] | None:
        c = layer_costs(g, units, link, cost)
        speeds = 1.0 / np.maximum(c.seconds.sum(axis=0), 1e-12)
        if c.n < len(units):
            cands = [layer_pipeline(g, list(o), layer_ranges(c.n, [speeds[d] for d in o])) for o in orders]
            return best_fitting(g, list(dict.fromkeys(cands)), m, units, link, cost)
        splits = best_splits(c, orders, mem, m) or best_splits(replace(c, act_bytes=np.zeros(c.n)), orders, mem, m)
        if not splits:
            return None
        cands = [layer_pipeline(g, list(s.order), list(s.counts)) for s in splits]
        cands += [layer_pipeline(g, list(s.order), layer_ranges(c.n, [speeds[d] for d in s.order])) for s in splits]
        return best_fitting(g, list(dict.fromkeys(cands)), m, units, link, cost)
    return place
