"""Score the four baselines (placements from baselines.py) as Plans; not-applicable ones say why."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from tessera.cost import CostModel
from tessera.graph import Role
from tessera.plan import baselines as bl
from tessera.plan.pool import Pool, Workload
from tessera.plan.score import GB, GraphSource, PhaseSpec, Scored, phase_shape, score


def build_baselines(model: str, order: list[str], source: GraphSource, pool: Pool, w: Workload, cost: CostModel,
                    mode: str, bound_fn: Any, *, points: bool) -> dict[str, Any]:
    from tessera.plan.planner import Outcome

    common = dict(model=model, mode=mode, source=source, cost=cost, points=points)
    w1, w = w, replace(w, batch=w.batch * pool.n)  # per GPU (homogeneous replicas) / per cell
    out: dict[str, Outcome] = {}

    def best_of(name: str, tries: list[tuple[Pool, list[PhaseSpec], int]], wl: Workload) -> Scored | None:
        scored = [score(strategy=name, pool=p, workload=wl, phases=ph, replicas=r,
                        bound_s=bound_fn if wl.batch == w.batch else None, **common) for p, ph, r in tries]
        ok = [s for s in scored if s.feasible]
        if ok:
            return min(ok, key=lambda s: s.cycle_s)
        return min(scored, key=lambda s: s.cycle_s) if scored else None

    def with_batch(name: str, make: Any, top: int | None = None) -> Outcome:
        """Largest batch (B, B/2, …) at which the strategy fits."""
        b, last = top or w.batch, None
        while True:
            wl = replace(w, batch=b)
            sc = best_of(name, make(wl), wl)
            if sc is not None and sc.feasible:
                notes = sc.plan.notes + ((f"batch reduced to {b} to fit memory",) if b != (top or w.batch) else ())
                return Outcome(name=name, applicable=True, plan=replace(sc.plan, notes=notes))
            last = last or sc
            if b == 1:
                return Outcome(name=name, applicable=True, plan=last.plan if last else None,
                               reason=last.reason if last else "nothing to score")
            b //= 2

    # ---- homogeneous: every GPU its own replica (one GPU per replica; TP not modelled) ----
    singles = []
    for d, gp in enumerate(pool.gpus):
        one = Pool(gpus=(gp,), link=pool.link)
        o = with_batch("homogeneous", lambda wl, one=one: [(one, [PhaseSpec(phase=p, assignment=(), uniform=0, m=1)
                                                             for p in order], 1)], w1.batch)
        singles.append((d, o))
    fits = [(d, o) for d, o in singles if o.feasible]
    if fits:
        tot = sum(o.throughput for _, o in fits)
        d0, o0 = max(fits, key=lambda x: x[1].throughput)
        p0 = o0.plan
        assert p0 is not None
        usd = pool.usd_per_hour
        per = ", ".join(f"{pool.gpus[d].name} {o.throughput:.1f}" for d, o in fits)
        skipped = [f"{pool.gpus[d].name}: {o.reason}" for d, o in singles if not o.feasible]
        dit = p0.throughput_images_per_s is not None
        # fastest first, so members[0] is the replica whose phases the plan shows (p0)
        members = tuple(o.plan for _, o in sorted(fits, key=lambda x: -x[1].throughput) if o.plan is not None)
        # Unused GPUs (those no replica fits on) still cost money: usd is the whole pool's.
        plan = replace(p0, usd_per_hour=usd, replicas=1, members=members,
                       devices=tuple(replace(m.devices[0], index=i) for i, m in enumerate(members)),
                       memory_bytes=tuple(m.memory_bytes[0] for m in members),
                       kv_capacity_tokens=sum(m.kv_capacity_tokens for m in members),
                       throughput_tokens_per_s=None if dit else tot, throughput_images_per_s=tot if dit else None,
                       usd_per_million_tokens=usd / 3600 / tot * 1e6,
                       notes=p0.notes + (f"independent replicas, throughput summed: {per}; phases show "
                                         f"the {pool.gpus[d0].name} replica, members hold each", *skipped))
        out["homogeneous"] = Outcome(name="homogeneous", applicable=True, plan=plan)
    else:
        why = "; ".join(f"{pool.gpus[d].name}: {o.reason}" for d, o in singles)
        out["homogeneous"] = Outcome(name="homogeneous", applicable=True, reason=f"no GPU holds a replica "
                                     f"(tensor parallelism is not modelled): {why}")
    # ---- prefill/decode disaggregation ----
    if not ("prefill" in order and "decode" in order):
        out["prefill_decode"] = Outcome(name="prefill_decode", applicable=False,
                                        reason="no prefill/decode phases (a single-phase model)")
    elif pool.n != 2:
        out["prefill_decode"] = Outcome(name="prefill_decode", applicable=False, reason="needs a pair of GPUs")
    else:
        def pd(wl: Workload) -> list[tuple[Pool, list[PhaseSpec], int]]:
            tries = []
            for a, b in ((0, 1), (1, 0)):
                seq, _, _ = phase_shape("prefill", wl)
                gp = source("prefill", wl.batch, seq, 0)
                kv = sum(x.bytes for x in gp.buffers if x.role in (Role.KV, Role.STATE))
                specs = [PhaseSpec(phase=p, assignment=(), uniform=a if p != "decode" else b, m=1,
                                   handoffs=((kv, a, b),) if p == "prefill" else ()) for p in order]
                tries.append((pool, specs, 1))
            return tries
        out["prefill_decode"] = with_batch("prefill_decode", pd)
    # ---- attention/FFN disaggregation ----
    seq0, ctx0, _ = phase_shape(order[0], w)
    g0 = source(order[0], 1, seq0, ctx0)
    if not bl.has_attention(g0):
        out["attention_ffn"] = Outcome(name="attention_ffn", applicable=False,
                                       reason="no attention kernels (e.g. a state-space model)")
    elif pool.n != 2:
        out["attention_ffn"] = Outcome(name="attention_ffn", applicable=False, reason="needs a pair of GPUs")
    else:
        def af(wl: Workload) -> list[tuple[Pool, list[PhaseSpec], int]]:
            tries = []
            for (a, b), m in itertools.product(((0, 1), (1, 0)), (2, 4)):
                if m > wl.batch:
                    continue
                specs = []
                for p in order:
                    seq, ctx, _ = phase_shape(p, wl)
                    specs.append(PhaseSpec(phase=p, assignment=bl.attention_ffn(source(p, max(1, wl.batch // m),
                                                                                     seq, ctx), a, b), m=m))
                tries.append((pool, specs, 1))
            return tries
        out["attention_ffn"] = with_batch("attention_ffn", af)
    # ---- layer pipeline ----
    if pool.n < 2:
        out["layer_pipeline"] = Outcome(name="layer_pipeline", applicable=False, reason="needs two or more GPUs")
    else:
        times = [[cost.kernel_time_s(k, gp) for gp in pool.gpus] for k in g0.kernels]
        speeds = [1.0 / max(s, 1e-12) for s in bl.layer_seconds(g0, times)]

        def lp(wl: Workload) -> list[tuple[Pool, list[PhaseSpec], int]]:
            tries = []
            for perm in itertools.permutations(range(pool.n)):
                for m in (1, 2, 4):
                    if m > wl.batch:
                        continue
                    specs = []
                    for p in order:
                        seq, ctx, _ = phase_shape(p, wl)
                        g = source(p, max(1, wl.batch // m), seq, ctx)
                        counts = bl.layer_ranges(g.layers, [speeds[d] for d in perm])  # this phase's layers
                        specs.append(PhaseSpec(phase=p, assignment=bl.layer_pipeline(g, list(perm), counts), m=m))
                    tries.append((pool, specs, 1))
            return tries
        out["layer_pipeline"] = with_batch("layer_pipeline", lp)
    return out


__all__ = ["GB", "build_baselines"]
