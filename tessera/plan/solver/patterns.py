"""Repeated layers: a few layer patterns per segment, integer counts chosen by a small MILP (docs/plan.md).

A *segment* is a run of consecutive layers with identical kernels, internal dependencies, pins and
handoff destinations. Per segment: patterns p are placements of one layer's groups (sweep of the
weighted single-layer MILP, min Σ_d α_d·ℓ_d + β·Σ transfers, over a grid of α, β; plus "whole layer on
d"), each with per-layer loads ℓ[p,d], link loads c[p,a,b] (the layer-to-layer stream charged as if the
next layer had the same pattern), private resident bytes s[p,d].
The counts MILP, with every group outside segments kept as flat x[g,d]:
  n[p] ∈ ℤ≥0, u[p] ∈ {0,1}:  Σ_p∈s n[p] = L_s;  u[p] ≤ n[p] ≤ L_s·u[p]                  count[s], used[p]
  g[v,b] ≥ u[p]  for p placing a segment consumer of boundary value v on b               need[v,p,b]
  w[v,a] ≥ u[p]  for p placing a segment producer of boundary value v on a               src[v,p,a]
  y[v,a,b] ≥ S[v,a] + C[v,c,b] − 1  (S: x or w; C: x or g)                                 cross
  compute[d]: Σ t·x + Σ_p n[p]·ℓ[p,d] ≤ T;  link[a,b]: Σ s·y + Σ_p n[p]·c[p,a,b] + u[p]·r[p,a,b] ≤ T
  memory[d]:  Σ size·z + Σ_p n[p]·s[p,d] ≤ capacity − activations
r[p,a,b] is the run start: the stream entering a run of p may come from any other device (conservative).
Expansion orders the runs to minimise the exact bottleneck; the verifier then scores the flat result.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace

import numpy as np

from tessera.plan.solver.highs import Model
from tessera.plan.solver.milp import (
    Background,
    build_flat,
    loads,
    make_async,
    objective_value,
    weighted_costs,
)
from tessera.plan.solver.problem import Handoff, PhaseProblem, Resident, Value


@dataclass(kw_only=True)
class LayerSegment:
    layers: list[int]  # consecutive layer numbers
    groups: list[list[int]]  # [layer][offset] -> group id
    patterns: list[tuple[int, ...]] = field(default_factory=list)  # offset -> device
    # the layers' signature without where an earlier phase keeps their weights: segments that differ only
    # there have the same single-layer problem, hence the same patterns
    shape: tuple = ()


def _layer_groups(prob: PhaseProblem) -> dict[int, list[int]]:
    """layer -> its groups in program order. A group also touching the prologue (e.g. a cache-length
    state read there) belongs to its one layer, whose signature then differs from the others; a group
    spanning two layers stays outside every segment (flat)."""
    out: dict[int, list[int]] = {}
    for g, ks in enumerate(prob.groups):
        layers = {prob.graph.kernels[k].layer for k in ks} - {None}
        if len(layers) == 1:
            out.setdefault(layers.pop(), []).append(g)
    return out


def _signature(prob: PhaseProblem, gs: list[int], nxt: list[int] | None, own: list[Resident] = ()) -> tuple:
    pos = {g: i for i, g in enumerate(gs)}
    npos = {g: i for i, g in enumerate(nxt or [])}
    kern = tuple(tuple((prob.graph.kernels[k].name, prob.graph.kernels[k].kind, tuple(sorted(
        prob.graph.kernels[k].dims.items()))) for k in prob.groups[g]) for g in gs)
    vals = tuple(sorted((pos[v.src], tuple(sorted(pos[c] for c in v.dst if c in pos)),
                         tuple(sorted(npos[c] for c in v.dst if c in npos)), v.bytes)
                        for v in prob.values if v.src in pos))
    pins = tuple(prob.pinned.get(g, -1) for g in gs)
    hand = tuple(sorted((pos[h.src], h.device, h.bytes) for h in prob.handoffs if h.src in pos))
    # where an earlier phase already keeps the layer's private residents: the counts MILP prices a
    # pattern's bytes on its representative layer, exact only if every layer of the segment agrees
    pre = tuple(sorted((tuple(pos[g] for g in w.groups), tuple(sorted(prob.preresident.get(w.name, ()))))
                       for w in own))
    return kern, vals, pins, hand, pre


def find_segments(prob: PhaseProblem, min_layers: int = 3) -> list[LayerSegment]:
    by_layer = _layer_groups(prob)
    if not by_layer:
        return []
    layers = sorted(by_layer)
    own: dict[int, list[Resident]] = {}  # layer -> residents touched by that layer's groups only
    if prob.preresident:
        layer_of = {g: lay for lay, gs in by_layer.items() for g in gs}
        for w in prob.residents:
            where = {layer_of.get(g) for g in w.groups}
            if len(where) == 1 and None not in where:
                own.setdefault(where.pop(), []).append(w)
    sigs = [_signature(prob, by_layer[lay], by_layer.get(lay + 1), own.get(lay, [])) for lay in layers]
    inner = [s[:1] + (tuple(v[:2] + v[3:] for v in s[1]),) + s[2:] for s in sigs]  # ignore next-layer part
    segs: list[LayerSegment] = []
    i = 0
    while i < len(layers):
        j = i
        while (j + 1 < len(layers) and layers[j + 1] == layers[j] + 1 and inner[j + 1] == inner[i]
               and (j + 1 == i + 1 or sigs[j] == sigs[i])):
            j += 1
        # the last layer's stream goes elsewhere; all earlier ones must stream alike
        if j - i + 1 >= min_layers and all(sigs[q] == sigs[i] for q in range(i, j)):
            segs.append(LayerSegment(layers=layers[i:j + 1], groups=[by_layer[q] for q in layers[i:j + 1]],
                                shape=sigs[i][:4]))
        i = j + 1
    return segs


def _layer_problem(prob: PhaseProblem, seg: LayerSegment, *, walk: bool = False) -> PhaseProblem:
    """One representative layer (the segment's first) with its stream to the next layer folded back in.

    ``walk``: leave out the primary stream value (the largest one crossing into the next layer); the
    counts MILP charges it through the walk (entry/exit devices and jumps) instead.
    """
    prim = _primary_stream(prob, seg)
    gs, nxt = seg.groups[0], seg.groups[1]
    pos = {g: i for i, g in enumerate(gs)}
    npos = {g: i for i, g in enumerate(nxt)}
    values, xfer = [], []
    for vi, v in enumerate(prob.values):
        if v.src not in pos:
            continue
        dst = sorted({pos[c] for c in v.dst if c in pos} | {npos[c] for c in v.dst if c in npos})
        dst = [c for c in dst if c != pos[v.src]]
        if walk and prim is not None and v is prob.values[prim]:
            dst = [pos[c] for c in v.dst if c in pos and pos[c] != pos[v.src]]
        if dst:
            values.append(replace(v, src=pos[v.src], dst=tuple(dst)))
            xfer.append(prob.xfer_s[vi])
    hand = [replace(h, src=pos[h.src]) for h in prob.handoffs if h.src in pos]
    own = [replace(w, groups=tuple(pos[g] for g in w.groups)) for w in prob.residents
           if all(g in pos for g in w.groups)]  # the layer's private weights / kv (for the memory sweep)
    return replace(prob, groups=[prob.groups[g] for g in gs], group_of=[], t=prob.t[gs], values=values,
                   xfer_s=np.array(xfer), residents=own, handoffs=hand, preresident={},
                   pinned={pos[g]: d for g, d in prob.pinned.items() if g in pos})


def _primary_stream(prob: PhaseProblem, seg: LayerSegment) -> int | None:
    """Index of the largest value from the segment's first layer into its second (the residual stream)."""
    here, nxt = set(seg.groups[0]), set(seg.groups[1])
    cands = [(v.bytes, -vi) for vi, v in enumerate(prob.values) if v.src in here and any(c in nxt for c in v.dst)]
    return -max(cands)[1] if cands else None


def _entry_exit(prob: PhaseProblem, seg: LayerSegment, pat: tuple[int, ...]) -> tuple[int, int, list[int]]:
    """(entry device e_p, exit device o_p, other entry devices) of the primary stream under pattern p."""
    prim = prob.values[_primary_stream(prob, seg)]  # type: ignore[index]
    pos = {g: i for i, g in enumerate(seg.groups[0])}
    npos = {g: i for i, g in enumerate(seg.groups[1])}
    ins = [pat[npos[c]] for c in prim.dst if c in npos]
    return ins[0], pat[pos[prim.src]], sorted(set(ins) - {ins[0]})


def generate_patterns(prob: PhaseProblem, seg: LayerSegment) -> list[tuple[int, ...]]:
    """Pareto sweep of the weighted single-layer MILP + whole layer on each device, deduplicated."""
    sub = _layer_problem(prob, seg)
    D = prob.D  # noqa: N806
    found: dict[tuple[int, ...], None] = {}
    free = [g for g in range(sub.G) if g not in sub.pinned]
    for d in range(D):
        found[tuple(sub.pinned.get(g, d) for g in range(sub.G))] = None
    ratios = [2.0 ** (k / 2) for k in range(-12, 13)]
    # device weights α: 4^D vectors up to 3 devices; from 4 devices on (a 16-GPU pool's five TP groups) all
    # ones and each device 4× cheaper or dearer than the rest (2D + 1), else the sweep grows to thousands of
    # LPs per layer pattern (minutes per search point)
    if D == 2:
        grid = [(1.0, r) for r in ratios]
    elif D == 3:
        grid = [tuple(w) for w in itertools.product([1.0, 2.0, 4.0, 8.0], repeat=D)]
    else:
        grid = [(1.0,) * D] + [tuple(x if d == e else y for d in range(D)) for e in range(D)
                               for x, y in ((1.0, 4.0), (4.0, 1.0))]
    # memory prices γ_d (seconds per byte, scaled to the layer's time per byte): patterns that keep bytes
    # off a device at some cost in time, for pools where weights barely fit
    scale = float(sub.t.mean()) * sub.G / max(1.0, float(sum(w.bytes for w in sub.residents)))
    gammas: list[tuple[float, ...] | None] = [None] + [
        tuple(k * scale if d == e else 0.0 for d in range(D)) for e in range(D) for k in (0.25, 0.5, 1.0, 2.0)]
    # one model, re-solved per sweep point with its costs (only the objective changes across the sweep)
    model, idx = build_flat(sub, objective="weighted", memory=False, mem_price=tuple([0.0] * D))
    solver = model.resolver(time_limit_s=5.0)
    for gamma in gammas:
        for alpha in (grid if gamma is None else grid[::3]):
            for beta in ((0.0, 0.05, 0.25, 1.0) if gamma is None else (0.05,)):
                a = tuple(x / max(alpha) for x in alpha)
                sol = solver.solve(weighted_costs(sub, idx, model.n_cols, alpha=a, beta=beta * min(a),
                                                  mem_price=gamma))
                if sol.ok:
                    found[tuple(int(i) for i in np.argmax(sol.values[idx.x], axis=1))] = None
    assert free is not None
    return list(found)


@dataclass(frozen=True, kw_only=True)
class PatternResult:
    group_dev: tuple[int, ...]
    objective: float
    status: str
    solve_s: float
    counts: tuple[tuple[int, ...], ...]  # per segment, per pattern
    n_patterns: int


def solve_patterns(prob: PhaseProblem, segs: list[LayerSegment], *, objective: str = "throughput",
                   omega: float = 1.0, background: Background | None = None, mip_rel_gap: float = 1e-2,
                   time_limit_s: float = 30.0, m_micro: int = 1, max_nodes: int | None = None) -> PatternResult:
    t0 = time.perf_counter()
    made: dict[tuple, list[tuple[int, ...]]] = {}
    for s in segs:
        if not s.patterns:
            s.patterns = made[s.shape] if s.shape and s.shape in made else generate_patterns(prob, s)
        made.setdefault(s.shape, s.patterns)
    D, pairs = prob.D, prob.pool.pairs()  # noqa: N806
    asyn = objective == "async"  # built as "step", then turned into the async period (milp.make_async)
    thr = objective == "throughput"
    rows_t = objective in ("throughput", "step", "async")
    seg_of: dict[int, tuple[int, int, int]] = {}  # group -> (segment, layer index, offset)
    for si, s in enumerate(segs):
        for li, gs in enumerate(s.groups):
            for off, g in enumerate(gs):
                seg_of[g] = (si, li, off)
    m = Model(f"patterns[{prob.graph.model}/{prob.graph.phase}]")
    T = m.var("T", cost=1.0 if thr else float(m_micro - 1)) if rows_t else None  # noqa: N806
    # ---- step 1: flat x[g,d] for groups outside segments ----
    x: dict[tuple[int, int], int] = {}
    for g in range(prob.G):
        if g in seg_of:
            continue
        pin = prob.pinned.get(g)
        for d in range(D):
            c = 0.0 if thr else float(prob.t[g, d])
            x[g, d] = m.var(f"x[{g},{d}]", lb=float(pin == d), ub=float(pin is None or pin == d), cost=c,
                            integer=True)
        m.row(f"assign[{g}]", {x[g, d]: 1.0 for d in range(D)}, lb=1.0, ub=1.0)
    # ---- step 2: counts n[p], used u[p], per-pattern loads ----
    n: list[list[int]] = []
    u: list[list[int]] = []
    comp = [dict[int, float]() for _ in range(D)]
    link = {p: dict[int, float]() for p in pairs}
    mem = [dict[int, float]() for _ in range(D)]
    for si, s in enumerate(segs):
        sub = _layer_problem(prob, s, walk=True)
        prim = _primary_stream(prob, s)
        assert prim is not None
        sv_s = float(prob.xfer_s[prim])  # one send of the stream value
        L = len(s.layers)  # noqa: N806
        n.append([])
        u.append([])
        # walk over devices: st/en free start/end, J[a,b] jumps (stream sends between layers)
        st = [m.var(f"start[{si},{d}]", ub=1.0) for d in range(D)]
        en = [m.var(f"end[{si},{d}]", ub=1.0) for d in range(D)]
        m.row(f"one_start[{si}]", {c: 1.0 for c in st}, lb=1.0, ub=1.0)
        m.row(f"one_end[{si}]", {c: 1.0 for c in en}, lb=1.0, ub=1.0)
        jump = {p: m.var(f"J[{si},{p[0]},{p[1]}]", cost=0.0 if thr else sv_s) for p in pairs}
        balance = [{st[d]: 1.0, en[d]: -1.0} for d in range(D)]  # arrivals − departures = 0
        enter_by: list[list[int]] = [[] for _ in range(D)]  # patterns entering at d
        arrive = [{st[d]: 1.0, **{jump[a, d]: 1.0 for a in range(D) if a != d}} for d in range(D)]
        for p in pairs:
            link[p][jump[p]] = omega * sv_s
            balance[p[1]][jump[p]] = balance[p[1]].get(jump[p], 0.0) + 1.0
            balance[p[0]][jump[p]] = balance[p[0]].get(jump[p], 0.0) - 1.0
        for pi, pat in enumerate(s.patterns):
            ld_dev, ld_link = loads(sub, pat)
            e, o, extra = _entry_exit(prob, s, pat)
            for b in extra:  # forwarded from the primary entry device to the other readers
                ld_link[e, b] += sv_s
            tot = sum(ld_dev) + sum(ld_link.values())
            nc = m.var(f"n[{si},{pi}]", ub=L, integer=True, cost=0.0 if thr else tot)
            uc = m.var(f"u[{si},{pi}]", ub=1.0, integer=True)
            n[si].append(nc)
            u[si].append(uc)
            m.row(f"used_lo[{si},{pi}]", {uc: 1.0, nc: -1.0}, ub=0.0)
            m.row(f"used_hi[{si},{pi}]", {nc: 1.0, uc: -float(L)}, ub=0.0)
            balance[o][nc] = balance[o].get(nc, 0.0) + 1.0
            balance[e][nc] = balance[e].get(nc, 0.0) - 1.0
            enter_by[e].append(uc)
            if o != e:
                arrive[o][nc] = arrive[o].get(nc, 0.0) + 1.0
            for d in range(D):
                comp[d][nc] = omega * ld_dev[d]
                mem[d][nc] = float(_private_bytes(prob, s, pat, d))
            for p in pairs:
                link[p][nc] = omega * ld_link[p]
        m.row(f"count[{si}]", {c: 1.0 for c in n[si]}, lb=L, ub=L)
        for d in range(D):
            m.row(f"walk[{si},{d}]", balance[d], lb=0.0, ub=0.0)
            for uc in enter_by[d]:  # reachability: a used pattern entering at d needs a way into d
                m.row(f"reach[{si},{d},{uc}]", {**arrive[d], uc: -1.0}, lb=0.0)
    for d in range(D):
        for g in range(prob.G):
            if (g, d) in x:
                comp[d][x[g, d]] = omega * float(prob.t[g, d])

    # ---- step 3: indicators "some used pattern puts this segment group on d" ----
    ind_cache: dict[tuple[int, int], int] = {}

    def on(g: int, d: int, tag: str) -> int:
        """Column that is 1 when group g may be on d: x for flat groups, else an indicator ≥ u[p]."""
        if g not in seg_of:
            return x[g, d]
        si, _, off = seg_of[g]
        key = (si * 1_000_003 + off, d)
        if key not in ind_cache:
            col = m.var(f"{tag}[{si},{off},{d}]", ub=1.0)
            for pi, pat in enumerate(segs[si].patterns):
                if pat[off] == d:
                    m.row(f"{tag}_used[{si},{off},{pi},{d}]", {col: 1.0, u[si][pi]: -1.0}, lb=0.0)
            ind_cache[key] = col
        return ind_cache[key]

    # ---- step 4: boundary values (anything not inside one layer or its stream to the next) ----
    for vi, v in enumerate(prob.values):
        s_src = seg_of.get(v.src)
        outer = [c for c in v.dst if not (s_src and c in seg_of and seg_of[c][0] == s_src[0]
                                          and seg_of[c][1] in (s_src[1], s_src[1] + 1))]
        if not outer:
            continue
        for a, b in pairs:
            col = m.var(f"y[{vi},{a},{b}]", ub=1.0, cost=0.0 if thr else float(prob.xfer_s[vi]))
            link[a, b][col] = link[a, b].get(col, 0.0) + omega * float(prob.xfer_s[vi])
            for cc in dict.fromkeys(on(c, b, "g") for c in outer):  # one row per distinct indicator
                m.row(f"cross[{vi},{cc},{a},{b}]", {col: 1.0, on(v.src, a, "w"): -1.0, cc: -1.0}, lb=-1.0)
    for h in prob.handoffs:
        if h.src not in seg_of:
            for a in range(D):
                if a != h.device:
                    link[a, h.device][x[h.src, a]] = link[a, h.device].get(x[h.src, a], 0.0) + \
                        omega * prob.handoff_s(h)
    # ---- step 5: residents shared beyond one layer (z ≥ indicator) ----
    for wi, w in enumerate(prob.residents):
        if _private(w, seg_of):
            continue
        for d in range(D):
            if d in prob.preresident.get(w.name, frozenset()):
                continue
            col = m.var(f"z[{wi},{d}]", ub=1.0)
            for g in w.groups:
                m.row(f"resident[{wi},{g},{d}]", {col: 1.0, on(g, d, "g"): -1.0}, lb=0.0)
            mem[d][col] = float(w.bytes)
    # ---- step 6: load and memory rows ----
    if rows_t:
        bg = background or Background(device_s=tuple([0.0] * D))
        for d in range(D):
            m.row(f"compute[{d}]", {**comp[d], T: -1.0}, ub=-bg.device_s[d])
        for p in pairs:
            m.row(f"link[{p[0]},{p[1]}]", {**link[p], T: -1.0}, ub=-bg.link_s.get(p, 0.0))
    for d in range(D):
        m.row(f"memory[{d}]", mem[d], ub=prob.free_bytes(d))
    if asyn:
        assert T is not None
        make_async(m, T, m_micro)
    sol = m.solve(mip_rel_gap=mip_rel_gap, time_limit_s=time_limit_s, max_nodes=max_nodes)
    if not sol.ok:
        return PatternResult(group_dev=(), objective=float("inf"), status=sol.status,
                             solve_s=time.perf_counter() - t0, counts=(), n_patterns=0)
    counts = tuple(tuple(int(round(sol.values[c])) for c in n[si]) for si in range(len(segs)))
    base = [0] * prob.G
    for (g, d), col in x.items():
        if sol.values[col] > 0.5:
            base[g] = d
    gd = _expand(prob, segs, counts, base, objective=objective, m=m_micro, background=background)
    obj = float(sol.values[T]) if T is not None and (thr or asyn) else sol.objective
    return PatternResult(group_dev=gd, objective=obj, status=sol.status, solve_s=time.perf_counter() - t0,
                         counts=counts, n_patterns=sum(len(s.patterns) for s in segs))


def _private(w: Resident, seg_of: dict[int, tuple[int, int, int]]) -> bool:
    where = {seg_of[g][:2] if g in seg_of else None for g in w.groups}
    return len(where) == 1 and None not in where


def _private_bytes(prob: PhaseProblem, seg: LayerSegment, pat: tuple[int, ...], d: int) -> int:
    """s[p,d]: bytes of the representative layer's private residents that pattern p puts on d."""
    pos = {g: i for i, g in enumerate(seg.groups[0])}
    tot = 0
    for w in prob.residents:
        if all(g in pos for g in w.groups) and d not in prob.preresident.get(w.name, frozenset()):
            if any(pat[pos[g]] == d for g in w.groups):
                tot += w.bytes
    return tot


def _expand(prob: PhaseProblem, segs: list[LayerSegment], counts: tuple[tuple[int, ...], ...],
            base: list[int], *, objective: str, m: int, background: Background | None) -> tuple[int, ...]:
    """Lay runs of patterns onto layers; try every order of the used patterns (few) and keep the best."""
    gd = list(base)

    def lay(s: LayerSegment, order: tuple[tuple[int, int], ...]) -> None:
        li = 0
        for pi, c in order:
            for _ in range(c):
                for off, g in enumerate(s.groups[li]):
                    gd[g] = s.patterns[pi][off]
                li += 1

    for si, s in enumerate(segs):
        lay(s, tuple((pi, c) for pi, c in enumerate(counts[si]) if c > 0))
    for si, s in enumerate(segs):
        used = [(pi, c) for pi, c in enumerate(counts[si]) if c > 0]
        best: tuple[float, list[int]] | None = None
        orders = list(itertools.permutations(used)) if len(used) <= 4 else [tuple(used)]
        ends = {pi: _entry_exit(prob, s, s.patterns[pi])[:2] for pi, _ in used}
        orders += [_greedy_walk(used, ends, d) for d in range(prob.D)]
        for order in orders:
            lay(s, order)
            score = objective_value(prob, gd, objective, m, background)
            if best is None or score < best[0]:
                best = (score, list(gd))
        assert best is not None
        gd[:] = best[1]
    return tuple(gd)


def _greedy_walk(used: list[tuple[int, int]], ends: dict[int, tuple[int, int]],
                 start: int) -> tuple[tuple[int, int], ...]:
    """An order that follows the stream: from the current device take a pattern entering there (runs of
    one pattern first), jumping only when none is left."""
    left = dict(used)
    order: list[tuple[int, int]] = []
    cur = start
    while left:
        here = [pi for pi in left if ends[pi][0] == cur]
        loops = [pi for pi in here if ends[pi][1] == cur]
        pi = (loops or here or list(left))[0]
        take = left[pi] if ends[pi][0] == ends[pi][1] else 1
        order.append((pi, take))
        left[pi] -= take
        if left[pi] == 0:
            del left[pi]
        cur = ends[pi][1]
    return tuple(order)


__all__ = ["Handoff", "LayerSegment", "PatternResult", "Value", "find_segments", "generate_patterns",
           "solve_patterns"]


def polish(prob: PhaseProblem, segs: list[LayerSegment], group_dev: tuple[int, ...], *, free_layers: int = 2,
           objective: str = "throughput", omega: float = 1.0, background: Background | None = None,
           mip_rel_gap: float = 1e-2, time_limit_s: float = 10.0, m: int = 1,
           max_nodes: int | None = None) -> tuple[int, ...]:
    """Large-neighbourhood step: re-solve flat with every segment layer fixed except the layers around
    run changes (plus ``free_layers`` more per segment), from the pattern plan as MIP start."""
    from tessera.plan.solver.milp import solve_flat

    free: set[int] = set()
    for s in segs:
        keys = [tuple(group_dev[g] for g in gs) for gs in s.groups]
        changes = [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]]
        pick = {0, len(keys) - 1} | {c for i in changes for c in (i - 1, i)}
        extra = [i for i in range(len(keys)) if i not in pick][:free_layers]
        for i in pick | set(extra):
            free.update(s.groups[i])
    in_seg = {g for s in segs for gs in s.groups for g in gs}
    pins = {g: group_dev[g] for g in in_seg if g not in free}
    sub = replace(prob, pinned={**prob.pinned, **pins})
    res = solve_flat(sub, objective=objective, omega=omega, background=background, starts=[group_dev],
                     mip_rel_gap=mip_rel_gap, time_limit_s=time_limit_s, m=m, max_nodes=max_nodes)
    return res.group_dev if res.status in ("optimal", "feasible") else group_dev
