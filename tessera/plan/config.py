"""What the serving search is given and what it answers: PlannerConfig (passed down explicitly), one
strategy's result and the whole pool's (docs/plan.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tessera.contracts.enums import Objective
from tessera.contracts.plan import Plan, PoolCell, PoolPlan
from tessera.contracts.provenance import Provenance, Serializable, fingerprint
from tessera.contracts.results import StrategyFigures
from tessera.errors import UserError
from tessera.hardware import AUTO, check_link_name
from tessera.plan.model.serving import BUDGETS, Point, Slo, Traffic

MICROBATCHES = (1, 2, 4, 8)


@dataclass(frozen=True, kw_only=True)
class PlannerConfig:
    """Everything the search is given, passed down explicitly."""

    traffic: Traffic = field(default_factory=Traffic)
    slo: Slo = field(default_factory=Slo)
    link: str = AUTO  # between the GPUs of the cell: a catalog link, or "auto": the best the cell can have
    batch_cap: int | None = None  # largest batch (sequences / images in flight per cell) to consider
    microbatches: tuple[int, ...] = MICROBATCHES
    budgets: tuple[int, ...] = BUDGETS  # token budgets per micro-batch iteration tried (max_num_batched_tokens)
    ref_batch: int = 64  # batch of the one capture every shape is rescaled from
    mip_rel_gap: float = 2e-2
    time_limit_s: float = 10.0  # per MILP solve
    # branch-and-bound nodes per MILP solve: 1 stops at the root (presolve, cuts, heuristics, the baselines'
    # placements as MIP starts) with its incumbent. Deterministic, unlike the time limit; None: no limit.
    mip_max_nodes: int | None = 1
    max_tp: int = 8
    gpu_memory_utilization: float = 0.9  # share of each GPU's memory the engine may fill (vLLM's default)

    def __post_init__(self) -> None:
        if self.batch_cap is not None and self.batch_cap < 1:
            raise UserError(f"--batch {self.batch_cap} must be >= 1 (it caps the batch the planner chooses)")
        if not self.microbatches or any(m < 1 for m in self.microbatches):
            raise UserError(f"micro-batch counts {self.microbatches} must be positive")
        check_link_name(self.link)  # whether the cell can have it is checked where its GPUs are known
        if not self.budgets or any(not isinstance(k, int) or k < 1 for k in self.budgets):
            raise UserError(f"--max-num-batched-tokens {self.budgets} must be positive token counts")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise UserError(f"--gpu-memory-utilization {self.gpu_memory_utilization} must be a share of "
                            "the GPU's memory in (0, 1]")
        if self.mip_max_nodes is not None and self.mip_max_nodes < 1:
            raise ValueError(f"mip_max_nodes={self.mip_max_nodes} must be >= 1 (1: the root only) or None")
        if self.ref_batch < 1:
            raise ValueError(f"ref_batch={self.ref_batch} must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        """Every field, traffic and SLO as objects and the tuples as lists: what a fleet plan or an advice
        file records of the config its cells were planned with."""
        return {**asdict(self), "microbatches": list(self.microbatches), "budgets": list(self.budgets)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlannerConfig:
        """What ``to_dict`` wrote (a file from before token budgets were searched: the default budgets)."""
        return cls(**{**d, "traffic": Traffic(**d["traffic"]), "slo": Slo(**d["slo"]),
                      "microbatches": tuple(d["microbatches"]), "budgets": tuple(d.get("budgets", BUDGETS))})


@dataclass(frozen=True, kw_only=True)
class StrategyResult:
    """One strategy's answer. ``plan`` is one cell (its devices, phases, ``replicas`` identical copies);
    when the deployment is several *different* cells (homogeneous on a mixed pool) ``pool`` holds them with
    their counts and ``plan`` is its lead cell (the fastest type's replica, for the pictures of one cell).
    ``goodput`` and ``usd_per_hour`` are always the whole deployment's."""

    name: str
    applicable: bool
    reason: str | None = None  # not applicable, nothing fits, or no point meets the SLO
    plan: Plan | None = None
    pool: PoolPlan | None = None  # several different cells; None when the deployment is ``plan`` alone
    point: Point | None = None  # the cell's operating point (None for composite strategies)
    goodput: float = 0.0  # whole pool, output tokens/s (images/s) meeting the SLO
    usd_per_hour: float = 0.0
    tp: tuple[int, ...] = ()  # tensor-parallel degree of each device the strategy uses
    chosen: str | None = None  # Tessera: "milp" or the adopted baseline's name
    detail: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.pool is not None and self.plan != self.pool.lead:
            raise ValueError(f"strategy {self.name}: plan must be the pool's lead cell "
                             f"({self.pool.lead.devices[0].gpu}), got {self.plan and self.plan.devices[0].gpu}")

    @property
    def feasible(self) -> bool:
        return self.goodput > 0

    @property
    def deployment(self) -> Plan | PoolPlan | None:
        """What serves the traffic (what to simulate or save): the pool when there is one, else the plan."""
        return self.pool if self.pool is not None else self.plan

    @property
    def tokens_per_usd(self) -> float:
        return self.goodput * 3600 / self.usd_per_hour if self.usd_per_hour > 0 else 0.0

    def figures(self, *, images: bool) -> StrategyFigures:
        """The figures a file records of this strategy (``strategy_json`` writes them, the report reads them
        back): the goodput as its throughput and why not where infeasible, the price, the plan's latency and
        each device's memory ("index:gpu" -> bytes)."""
        p, ok = self.plan, self.feasible
        usd_per_mtok = self.usd_per_hour / 3600 / self.goodput * 1e6 if ok and not images else None
        return StrategyFigures(
            name=self.name, applicable=self.applicable, reason=None if ok else self.reason, feasible=ok,
            throughput_per_s=self.goodput if ok else None, usd_per_hour=self.usd_per_hour,
            usd_per_million_tokens=usd_per_mtok,
            latency_s=p.latency_s if p else None,
            memory_bytes={f"{i}:{d.gpu}": sum(p.memory_bytes[i].values()) for i, d in enumerate(p.devices)}
            if p else {})


@dataclass(frozen=True, kw_only=True)
class ServingResult:
    model: str
    gpus: tuple[str, ...]
    link: str
    config: PlannerConfig
    images: bool
    strategies: dict[str, StrategyResult] = field(hash=False)
    solve_s: float = 0.0
    wall_s: float = 0.0

    @property
    def tessera(self) -> StrategyResult:
        return self.strategies["tessera"]

    def to_json(self) -> dict[str, Any]:
        """The `tessera plan --json` contract."""
        return result_json(self)


# ---- the `tessera plan --json` contract --------------------------------------------------------------


def async_gain(p: Plan) -> float | None:
    """A Plan's output rate under asynchronous micro-batches over the same point re-synchronised every
    iteration (the synchronous period over the asynchronous one); None without a synchronous figure."""
    rate = p.throughput_images_per_s if p.throughput_images_per_s is not None else p.throughput_tokens_per_s
    return rate / p.sync_throughput if rate and p.sync_throughput else None


def strategy_json(r: ServingResult, name: str) -> dict[str, Any]:
    s = r.strategies[name]
    p, f = s.plan, s.figures(images=r.images)  # f: what the report reads back of this entry
    unit = "images_per_s" if r.images else "tokens_per_s"
    ent: dict[str, Any] = {
        "applicable": f.applicable, "feasible": f.feasible, "reason": f.reason,
        "chosen": s.chosen, "usd_per_hour": f.usd_per_hour,
        "usd_per_million_tokens": f.usd_per_million_tokens,
        "tokens_per_usd": s.tokens_per_usd if s.feasible else None,
        f"throughput_{unit}": f.throughput_per_s,
        f"goodput_{unit}": s.goodput,
        # the SLO knee's capacity (the engine saturating) beside the goodput, and what binds the knee
        f"capacity_{unit}": (s.pool.throughput_per_s if s.pool else _capacity(p)) if p else None,
        "slo_binding": s.point.knee.binding if s.point and s.point.knee else s.detail.get("binding"),
        "batch": p.batch if p else None, "microbatches": p.microbatches if p else None, "tp": list(s.tp),
        "max_num_batched_tokens": p.engine.max_num_batched_tokens if p and p.engine and not r.images else None,
        "ttft_s": p.ttft_s if p else None, "tpot_s": p.tpot_s if p else None,
        "latency_s": f.latency_s,
        # the operating point's own output rate (before the SLO) under either schedule: their ratio, not the
        # sync figure beside goodput, is the gain of asynchronous micro-batches
        f"sync_throughput_{unit}": p.sync_throughput if p and s.pool is None else None,
        "async_gain": async_gain(p) if p and s.pool is None else None,
        "device_busy": {f"{i}:{d.gpu}": b for i, (d, b) in enumerate(zip(p.devices, p.device_busy, strict=False))}
        if p else {},
        "idle_reason": s.detail.get("idle"),
        "memory_bytes": f.memory_bytes,
        "bound_ratio": p.bound_ratio if p else None,
        # a pool's notes are about the pool (its cells' own notes are in pool[i]'s plan)
        "notes": [f"independent replicas: {s.detail['replicas']}"] if s.pool else list(p.notes) if p else [],
        "detail": {k: v for k, v in s.detail.items() if k != "idle"},
        # several different cells (homogeneous on a mixed pool): each cell once, with its count; the
        # figures above that are per device (batch, busy, memory) are the lead cell's, pool[0]
        "pool": [_cell_json(c, unit) for c in s.pool.cells] if s.pool else None,
    }
    return ent


def _capacity(p: Plan) -> float | None:
    return p.throughput_images_per_s if p.throughput_images_per_s is not None else p.throughput_tokens_per_s


def _cell_json(c: PoolCell, unit: str) -> dict[str, Any]:
    p = c.plan
    return {"count": c.count, "replicas": p.replicas, "gpus": [d.gpu for d in p.devices],
            f"throughput_{unit}": p.throughput_images_per_s if unit == "images_per_s" else p.throughput_tokens_per_s,
            "usd_per_hour": p.usd_per_hour, "batch": p.batch, "microbatches": p.microbatches,
            "device_busy": list(p.device_busy), "memory_bytes": [sum(m.values()) for m in p.memory_bytes]}


def result_json(r: ServingResult) -> dict[str, Any]:
    c = r.config
    return {"model": r.model, "gpus": list(r.gpus), "link": r.link, "mode": Objective.THROUGHPUT.value,
            "slo": {"ttft_s": c.slo.ttft_s, "tpot_s": c.slo.tpot_s, "image_s": c.slo.image_s,
                    "target": c.slo.target},
            "traffic": {"prompt": c.traffic.prompt, "output": c.traffic.output, "steps": c.traffic.steps},
            "chosen": r.tessera.chosen, "solve_s": r.solve_s, "wall_s": r.wall_s,
            "bound_ratio": r.tessera.plan.bound_ratio if r.tessera.plan and r.tessera.chosen == "milp" else None,
            "strategies": {n: strategy_json(r, n) for n in r.strategies}}


def planner_provenance(model: str, cfg: PlannerConfig, deployment: Serializable | None = None, *,
                       images: bool = False) -> Provenance:
    """A planner's file (plan, fleet plan, advice, compare cell): the model, the plan it wrote or describes
    (None: none), the traffic and SLO it planned for; a planner simulates nothing, so no rate or seed.
    ``images``: a diffusion model's (its output is denoising steps, its SLO the latency of one image)."""
    t, slo = cfg.traffic, cfg.slo
    return Provenance(model=model, plan=fingerprint(deployment) if deployment is not None else None,
                      prompt=str(t.prompt), output=str(t.steps if images else t.output),
                      output_per_request=1.0 if images else float(t.output),
                      slo_ttft_s=None if images else slo.ttft_s, slo_tpot_s=None if images else slo.tpot_s,
                      slo_e2e_s=slo.image_s if images else None, slo_target=slo.target)
