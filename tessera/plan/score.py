"""Score any placement the same way: verifier loads per phase, pipeline step time, memory, throughput.

Tessera's plans and every baseline go through ``score``, so comparisons are like for like.
Request-batch cycle (LLM): B sequences, prompt P, output O; one prefill step and O decode steps.
  phases on shared devices:   cycle_s = Σ_phase n_phase·step_s      (time-shared)
  phases on disjoint devices: cycle_s = max_phase n_phase·step_s, and the KV link time (overlapped)
throughput = B·O / cycle_s output tokens per second (diffusion: B / (steps·step_s) images per second).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tessera.cost import CostModel
from tessera.graph import KernelGraph, Role
from tessera.plan.pool import Pool, Workload
from tessera.plan.types import Device, PhasePlan, Plan, StepPoint
from tessera.plan.verify import Evaluation, evaluate

GraphSource = Callable[[str, int, int, int], KernelGraph]  # (phase, batch, seq, context) -> graph
GB = 1e9


def step_time_s(m: int, t_s: float, latency_s: float) -> float:
    """step_s = max(m·T, latency + (m−1)·T) (types.StepPoint contract)."""
    return max(m * t_s, latency_s + (m - 1) * t_s)


def phase_objective_s(mode: str, m: int, bottleneck_s: float, busy_s: float, link_s: float) -> float:
    """The objective the planner minimises in ``mode`` (milp.objective_value), from a placement's verified
    loads; bound.cycle_bound relaxes it."""
    total = busy_s + link_s
    return total + (m - 1) * bottleneck_s if mode == "throughput" else total


def phase_shape(phase: str, w: Workload) -> tuple[int, int, int]:
    """(seq, context, steps per request batch) of a phase under the workload."""
    if phase == "decode":
        return 1, w.prompt + w.output, w.output
    if phase == "prefill":
        return w.prompt, 0, 1
    if phase == "denoise":
        return 0, 0, w.steps
    return 0, 0, 1  # encode


@dataclass(frozen=True, kw_only=True)
class PhaseSpec:
    phase: str
    assignment: tuple[int, ...]
    m: int
    handoffs: tuple[tuple[int, int, int], ...] = ()  # (bytes per micro-batch, src dev, dst dev)
    uniform: int | None = None  # every kernel on this device, whatever the graph's length (assignment ignored)

    def fit(self, g: KernelGraph) -> PhaseSpec:
        if self.uniform is not None:
            return replace(self, assignment=(self.uniform,) * len(g.kernels))
        return self


@dataclass(frozen=True, kw_only=True)
class Scored:
    plan: Plan
    feasible: bool
    reason: str | None
    cycle_s: float
    evals: dict[str, Evaluation] = field(hash=False)


def _mem(ev: Evaluation, m: int) -> list[dict[str, int]]:
    """Whole-step bytes per device: kv/state of all m micro-batches, activations of one."""
    return [{k: (v * m if k in ("kv", "state") else v) for k, v in d.items()} for d in ev.memory_bytes]


def score(*, model: str, strategy: str, mode: str, pool: Pool, workload: Workload, phases: list[PhaseSpec],
          source: GraphSource, cost: CostModel, replicas: int = 1, solve_s: float = 0.0,
          bound_s: Callable[[tuple[tuple[str, int], ...]], float | None] | None = None, notes: tuple[str, ...] = (),
          points: bool = True) -> Scored:
    w = workload
    evals: dict[str, Evaluation] = {}
    step: dict[str, float] = {}
    mem = [{"weight": 0, "kv": 0, "state": 0, "activation": 0} for _ in pool.gpus]
    held: list[set[str]] = [set() for _ in pool.gpus]
    users: dict[str, set[int]] = {}
    kv_link_s = 0.0
    phase_plans: dict[str, PhasePlan] = {}
    for ps in phases:
        seq, ctx, _ = phase_shape(ps.phase, w)
        mb = max(1, w.batch // ps.m)
        g = source(ps.phase, mb, seq, ctx)
        ps = ps.fit(g)
        ev = evaluate(g, ps.assignment, pool.gpus, pool.link, cost, handoffs=ps.handoffs)
        evals[ps.phase] = ev
        step[ps.phase] = step_time_s(ps.m, ev.bottleneck_s, ev.latency_s)
        kv_link_s += ps.m * sum(cost.transfer_time_s(b, pool.link) for b, a, d in ps.handoffs if a != d)
        users[ps.phase] = set(ps.assignment)
        # memory: resident buffers by name across phases (a weight used by two phases counts once)
        for d, md in enumerate(_mem(ev, ps.m)):
            mem[d]["activation"] = max(mem[d]["activation"], md["activation"])
        for k in g.kernels:
            d = ps.assignment[k.id]
            for b in (*k.reads, *k.writes):
                buf = g.buffers[b]
                if buf.role in (Role.WEIGHT, Role.KV, Role.STATE) and buf.name not in held[d]:
                    held[d].add(buf.name)
                    mem[d][str(buf.role)] += buf.bytes * (ps.m if buf.role != Role.WEIGHT else 1)
        phase_plans[ps.phase] = PhasePlan(
            phase=ps.phase, assignment=ps.assignment, microbatches=ps.m, graph_shape=dict(g.shape),
            points=_points(ps, g, ev, pool, w, source, cost) if points else (_point(ps, g, ev, w.batch),))
    n_steps = {p.phase: phase_shape(p.phase, w)[2] for p in phases}
    disjoint = len(phases) == 2 and not (users[phases[0].phase] & users[phases[1].phase])
    if disjoint:
        cycle = max([n_steps[p] * s for p, s in step.items()] + [kv_link_s])
    else:
        cycle = sum(n_steps[p] * s for p, s in step.items())
    over = [(d, sum(mem[d].values()) - pool.gpus[d].mem_bytes) for d in range(pool.n)]
    over = [(d, x) for d, x in over if x > 0]
    reason = None
    if over:
        d, x = max(over, key=lambda o: o[1])
        reason = (f"needs {sum(mem[d].values()) / GB:.1f} GB on {pool.gpus[d].name} (device {d}), "
                  f"capacity {pool.gpus[d].mem_bytes / GB:.1f} GB: {x / GB:.1f} GB short")
    # bound ratio on the planner's objective: bound / Σ n·objective(phase) (max when disjoint), where the objective
    # is the step (m−1)·T + Σ work + Σ transfers (throughput) or Σ work + Σ transfers (latency) and the bound
    # its LP relaxation with free transfers and the memory rows kept, all phases at once (bound.cycle_bound)
    per_phase = [n_steps[p.phase] * phase_objective_s(
        mode, p.m, evals[p.phase].bottleneck_s, sum(evals[p.phase].device_busy_s),
        sum(evals[p.phase].link_busy_s.values())) for p in phases]
    t_cycle = max(per_phase) if disjoint else sum(per_phase)  # as the cycle combines phases
    t_bound = bound_s(tuple((p.phase, p.m) for p in phases)) if bound_s and reason is None else None
    if t_bound is not None and t_bound > t_cycle * (1 + 1e-6):
        # the bound relaxes placements that keep each kv/state group on one device: every MILP plan does,
        # so above one of those it is wrong; a baseline that splits a group is simply outside it
        assert strategy != "tessera", (strategy, t_bound, t_cycle)
        t_bound = None
    dit = "denoise" in step
    per_cell = w.batch / cycle if dit else w.batch * w.output / cycle
    thr = per_cell * replicas if reason is None else None
    usd = pool.usd_per_hour * replicas
    kv_tok = _kv_bytes_per_token(source, phases, w)
    free = sum(pool.gpus[d].mem_bytes - mem[d]["weight"] - mem[d]["activation"] for d in range(pool.n))
    plan = Plan(
        model=model, strategy=strategy, mode=mode,
        devices=tuple(Device(index=i, gpu=gp.name, mem_bytes=gp.mem_bytes) for i, gp in enumerate(pool.gpus)),
        link=pool.link.name, replicas=replicas, phases=phase_plans, memory_bytes=tuple(mem),
        kv_bytes_per_token=kv_tok, kv_capacity_tokens=int(max(0, free) // kv_tok) if kv_tok else 0,
        throughput_tokens_per_s=None if dit else thr, throughput_images_per_s=thr if dit else None,
        latency_s=cycle, usd_per_hour=usd,
        usd_per_million_tokens=(usd / 3600 / thr * 1e6) if thr else None,
        bound_ratio=min(1.0, t_bound / t_cycle) if t_bound and t_cycle > 0 else None,  # 1 + roundoff -> 1
        solve_s=solve_s, workload={"batch": w.batch, "prompt": w.prompt, "output": w.output, "steps": w.steps},
        notes=notes + ((reason,) if reason else ()))
    return Scored(plan=plan, feasible=reason is None, reason=reason, cycle_s=cycle, evals=evals)


def _kv_bytes_per_token(source: GraphSource, phases: list[PhaseSpec], w: Workload) -> int:
    dec = [p for p in phases if p.phase == "decode"]
    if not dec:
        return 0
    mb = max(1, w.batch // dec[0].m)
    g = source("decode", mb, 1, w.prompt + w.output)
    kv = sum(b.bytes for b in g.buffers if b.role in (Role.KV, Role.STATE))
    return int(kv // max(1, mb * (w.prompt + w.output)))


def _point(ps: PhaseSpec, g: KernelGraph, ev: Evaluation, batch: int) -> StepPoint:
    seq = g.shape.get("seq", 1)
    tokens = batch * (seq if ps.phase == "prefill" else 1) if ps.phase in ("prefill", "decode") else batch
    ctx = g.shape.get("context", 0) if ps.phase == "decode" else (seq if ps.phase == "prefill" else 0)
    return StepPoint(batch=batch, tokens=tokens, context=ctx, microbatches=ps.m,
                     device_busy_s=ev.device_busy_s, link_busy_s=ev.link_tuple(), latency_s=ev.latency_s,
                     step_s=step_time_s(ps.m, ev.bottleneck_s, ev.latency_s))


def _points(ps: PhaseSpec, g0: KernelGraph, ev0: Evaluation, pool: Pool, w: Workload, source: GraphSource,
            cost: CostModel) -> tuple[StepPoint, ...]:
    """StepPoints at batch ∈ {B/4, B} (and context ∈ {P, P+O} for decode), micro-batch shape B/m."""
    seq, ctx, _ = phase_shape(ps.phase, w)
    out = [_point(ps, g0, ev0, w.batch)]
    batches = sorted({max(1, w.batch // 4), w.batch})
    ctxs = sorted({w.prompt, w.prompt + w.output}) if ps.phase == "decode" else [ctx]
    for b in batches:
        for c in ctxs:
            if b == w.batch and c == ctx:
                continue
            m = min(ps.m, b)
            g = source(ps.phase, max(1, b // m), seq, c)
            if ps.uniform is None and len(g.kernels) != len(ps.assignment):
                continue  # the kernel sequence changed with the shape (MoE routing at tiny batches)
            ps = ps.fit(g)
            ev = evaluate(g, ps.assignment, pool.gpus, pool.link, cost, handoffs=ps.handoffs)
            out.append(_point(PhaseSpec(phase=ps.phase, assignment=ps.assignment, m=m), g, ev, b))
    return tuple(sorted(out, key=lambda p: (p.batch, p.context)))
