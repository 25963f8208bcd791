"""`simulate(plan, workload, ...)`: the entry point other stages call."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from tessera.errors import UserError
from tessera.plan.types import Plan
from tessera.sim.adaptive import AdaptivePolicy, check_switchable
from tessera.sim.engine import Engine
from tessera.sim.metrics import SLO, SimResult, summarise
from tessera.sim.model import PlanModel, SchedulerConfig
from tessera.sim.replica import LOST, Replica, State
from tessera.sim.workload import WorkloadSpec, generate


@dataclass(frozen=True)
class Run:
    """A finished simulation: the metrics plus what the trace and Gantt writers need."""

    result: SimResult
    models: dict[str, PlanModel] = field(hash=False)
    trace: list[tuple] = field(hash=False)


def run(plan: Plan, workload: WorkloadSpec, *, replicas: int = 1, policy: AdaptivePolicy | None = None,
        seed: int = 0, slo: SLO | None = None, config: SchedulerConfig | None = None,
        trace_window_s: tuple[float, float] | None = None) -> Run:
    if replicas < 1:
        raise UserError(f"replicas={replicas} must be >= 1")
    cfg = config or SchedulerConfig()
    models = {"throughput": PlanModel.build(plan, cfg)}
    switch_s = 0.0
    if policy is not None:
        check_switchable(plan, policy.latency_plan)
        models["latency"] = PlanModel.build(policy.latency_plan, cfg)
        if models["latency"].image != models["throughput"].image:
            raise UserError("adaptive plans must both serve images or both serve tokens")
        switch_s = policy.switch_cost_s(plan)
    start_mode = "latency" if policy is not None else "throughput"
    reqs = generate(workload, seed)
    st = State(arrival=reqs.arrival_s.tolist(), prompt=reqs.prompt.tolist(), output=reqs.output.tolist(),
               trace_window_s=trace_window_s)
    n_rep = replicas * plan.replicas  # plan.replicas: identical cells inside the plan (homogeneous baseline)
    reps = [Replica(i, st, models, start_mode, policy, switch_s) for i in range(n_rep)]
    t0 = time.perf_counter()
    Engine(st, reps, round_robin=cfg.router == "round_robin").run()
    runtime_s = time.perf_counter() - t0
    busy = np.zeros(len(plan.devices))
    for rep in reps:
        for (mode, phase), acc in rep.acc.items():
            table = models[mode].first if models[mode].first and models[mode].first.phase == phase \
                else models[mode].iter
            busy += np.asarray(acc) @ table.busy_s
    res = summarise(
        arrival=reqs.arrival_s, first_s=np.array(st.first_s), done_s=np.array(st.done_s),
        output=reqs.output.astype(float), lost=sum(1 for s in st.status if s == LOST),
        image=models["throughput"].image, slo=slo, usd_per_hour=plan.usd_per_hour * replicas, busy_s=busy,
        preemptions=st.preemptions, switches=sum(r.switches for r in reps), replicas=n_rep,
        runtime_s=runtime_s)
    return Run(result=res, models=models, trace=st.trace)


def simulate(plan: Plan, workload: WorkloadSpec, *, replicas: int = 1, policy: AdaptivePolicy | None = None,
             seed: int = 0, slo: SLO | None = None, config: SchedulerConfig | None = None) -> SimResult:
    """Serve ``workload`` on ``replicas`` copies of ``plan`` (each itself ``plan.replicas`` cells) behind
    a router; with ``policy``, each replica switches between ``policy.latency_plan`` and ``plan``."""
    return run(plan, workload, replicas=replicas, policy=policy, seed=seed, slo=slo, config=config).result
