"""Result types that cross stage boundaries, each with its one serializer."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tessera.errors import UserError

# The keys of `tessera simulate --json`, in the order it writes them.
CONTRACT_KEYS = ("requests", "completed", "lost", "sim_wall_s", "throughput_tokens_per_s", "ttft_s", "tpot_s",
                 "e2e_s", "slo_attainment", "usd_per_million_tokens")
PERCENTILES = ("p50", "p90", "p99")
DETAIL_FIGURES = ("requests_per_s", "images_per_s", "preemptions", "switches", "replicas", "runtime_s")
# The keys of `tessera run --json` before its "extra" object, in the order it writes them.
RUN_CONTRACT_KEYS = ("devices", "microbatches", "verified", "max_abs_diff", "tokens_identical",
                     "measured_step_s", "predicted_step_s", "throughput_tokens_per_s", "link_bytes")


@dataclass(frozen=True, kw_only=True)
class StrategyFigures:
    """What a `tessera plan --json` or `tessera compare --json` file records about one strategy: its figures
    (throughput or goodput, price, latency, memory per device), not its plans. The planner's own answer is
    ``tessera.plan.StrategyResult``, which holds the deployment itself and makes these figures of it
    (``StrategyResult.figures``); ``strategy_json`` writes them with the rest of its JSON and the report
    reads them back (``tessera.report.data.parse_strategy``), never the plans."""

    name: str
    applicable: bool
    reason: str | None = None
    feasible: bool = True
    throughput_per_s: float | None = None  # tokens/s, or images/s for diffusion (see CompareCell.unit)
    usd_per_hour: float = 0.0
    usd_per_million_tokens: float | None = None
    latency_s: float | None = None
    memory_bytes: dict[str, int] = field(default_factory=dict, hash=False)
    knee_ratio: float | None = None  # `tessera compare`: the simulator's SLO knee over the planner's goodput

    @property
    def scored(self) -> bool:
        """Has a throughput to compare: applicable, feasible and positive."""
        return self.applicable and self.feasible and (self.throughput_per_s or 0.0) > 0.0

    @property
    def throughput_per_usd_hour(self) -> float | None:
        if not self.scored or self.usd_per_hour <= 0:
            return None
        assert self.throughput_per_s is not None
        return self.throughput_per_s / self.usd_per_hour


@dataclass(frozen=True, kw_only=True)
class FrontierPoint:
    """One option on the throughput-cost plane (a strategy in a cell, or an advisor's GPU mix)."""

    label: str
    group: str  # legend entry: strategy name or "mix"
    usd_per_hour: float
    throughput_per_s: float

    def __post_init__(self) -> None:
        if not (self.usd_per_hour > 0 and self.throughput_per_s > 0):
            raise ValueError(f"frontier point {self.label!r}: usd_per_hour={self.usd_per_hour} and "
                             f"throughput_per_s={self.throughput_per_s} must be > 0")


@dataclass(frozen=True, kw_only=True)
class FailureReport:
    """The simulator's report on one injected Failure: replica ``replica`` lost at ``at_s`` (seconds of
    simulated time), its replacement joining ``replan_s`` later, ``requeued`` requests moved to survivors.
    Rates are output tokens/s (images/s for image plans) over the series' windows: the mean of the windows
    before the loss (``pre_per_s``), the lowest until recovery (``min_per_s``) and the median once the
    replacement has joined (``steady_per_s``); ``dip`` min / pre; ``recovery_s`` from the loss to the first
    window at the steady rate; ``requeued_drained_s`` from the loss to the last re-queued request's finish.
    None where the run holds no such window (or no such request)."""

    at_s: float
    replica: int
    replan_s: float
    requeued: int
    pre_per_s: float | None
    min_per_s: float | None
    steady_per_s: float | None
    dip: float | None
    recovery_s: float | None
    requeued_drained_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FailureReport:
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """What the simulator measured over one run; ``to_json`` is the `tessera simulate --json` contract,
    ``to_dict`` adds the ``detail`` object and ``from_dict`` reads either back."""

    requests: int
    completed: int
    lost: int  # requests that can never fit (prompt + output beyond the KV capacity)
    sim_wall_s: float  # simulated seconds from the first arrival to the last completion
    throughput_tokens_per_s: float  # generated (output) tokens / sim_wall_s; 0 for image plans
    ttft_s: dict[str, float | None] = field(hash=False)
    tpot_s: dict[str, float | None] = field(hash=False)
    e2e_s: dict[str, float | None] = field(hash=False)
    slo_attainment: float | None  # fraction of all requests meeting every given SLO; None without SLO
    usd_per_million_tokens: float | None  # None when no tokens were produced (image plans)
    requests_per_s: float = 0.0
    images_per_s: float = 0.0
    device_utilisation: tuple[float, ...] = ()  # per device of the cell, averaged over replicas (pools:
    # per device of each cell entry, then of each replacement entry, each averaged over its replicas)
    preemptions: int = 0
    switches: int = 0
    replicas: int = 1  # replicas at the start (pools: all cells' replicas; replacements not counted)
    runtime_s: float = 0.0  # real seconds the simulation took (not deterministic; not in the contract)
    replica_completed: tuple[int, ...] = ()  # requests completed per replica (replacements last)
    series_start_s: float = 0.0  # throughput series: windows of series_window_s from here (first arrival)
    series_window_s: float = 0.0
    series_per_s: tuple[float, ...] = ()  # output tokens/s (images/s for image plans) per window
    failures: tuple[FailureReport, ...] = ()  # one report per Failure

    def steady_per_s(self, start_s: float, end_s: float, default: float = float("nan")) -> float:
        """Mean of the throughput series over the whole windows between ``start_s`` and ``end_s`` (seconds
        from the first arrival): the steady rate once ramp-up is past and before the drain (at least one
        window; ``default`` when the series ends before ``start_s``)."""
        w = self.series_window_s
        i0 = int(start_s / w) + 1
        if len(self.series_per_s) <= i0:
            return default
        return float(np.mean(self.series_per_s[i0:max(int(end_s / w), i0 + 1)]))

    def to_json(self) -> dict[str, Any]:
        """Exactly the contract of `tessera simulate --json`."""
        return {k: getattr(self, k) for k in CONTRACT_KEYS}

    def to_dict(self) -> dict[str, Any]:
        """The contract plus a ``detail`` object with the remaining figures."""
        detail = {k: getattr(self, k) for k in ("requests_per_s", "images_per_s", "device_utilisation",
                                                 "preemptions", "switches", "replicas", "runtime_s")}
        series = {"start_s": self.series_start_s, "window_s": self.series_window_s,
                  "unit": "images/s" if self.images_per_s else "tokens/s", "per_s": list(self.series_per_s)}
        return {**self.to_json(), "detail": {
            **detail, "device_utilisation": list(self.device_utilisation),
            "replica_completed": list(self.replica_completed), "throughput_series": series,
            "failures": [f.to_dict() for f in self.failures]}}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> SimResult:
        """What ``to_json`` or ``to_dict`` wrote (other keys, a file's provenance, are its reader's); a
        missing or malformed field is one UserError line naming ``where``. ``from_dict(r.to_dict()) == r``."""
        if not isinstance(d, dict):
            raise UserError(f"{where}: expected a simulator result object")
        detail = d.get("detail") if isinstance(d.get("detail"), dict) else {}
        series = detail.get("throughput_series") if isinstance(detail.get("throughput_series"), dict) else {}
        counts = {k: int(_number(d, k, where)) for k in ("requests", "completed", "lost")}
        figures = {k: _number(detail, k, f"{where} detail") for k in DETAIL_FIGURES if k in detail}
        return cls(
            **counts, sim_wall_s=_number(d, "sim_wall_s", where),
            throughput_tokens_per_s=_number(d, "throughput_tokens_per_s", where),
            ttft_s=_percentiles(d, "ttft_s", where), tpot_s=_percentiles(d, "tpot_s", where),
            e2e_s=_percentiles(d, "e2e_s", where),
            slo_attainment=_maybe(d, "slo_attainment", where),
            usd_per_million_tokens=_maybe(d, "usd_per_million_tokens", where),
            **{k: int(v) if k in ("preemptions", "switches", "replicas") else v for k, v in figures.items()},
            device_utilisation=tuple(float(x) for x in detail.get("device_utilisation", ())),
            replica_completed=tuple(int(x) for x in detail.get("replica_completed", ())),
            series_start_s=float(series.get("start_s", 0.0)), series_window_s=float(series.get("window_s", 0.0)),
            series_per_s=tuple(float(x) for x in series.get("per_s", ())),
            failures=tuple(FailureReport.from_dict(f) for f in detail.get("failures", ())))


def _maybe(d: dict[str, Any], key: str, where: str) -> float | None:
    return None if d.get(key) is None else _number(d, key, where)


def _number(d: dict[str, Any], key: str, where: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
        raise UserError(f"{where}: field {key!r} must be a number, got {v!r}")
    return float(v)


def _percentiles(d: dict[str, Any], key: str, where: str) -> dict[str, float | None]:
    """{p50, p90, p99}: seconds, each None where no request gave a sample (nothing completed)."""
    p = d.get(key)
    if not isinstance(p, dict):
        raise UserError(f"{where}: field {key!r} must be an object with p50, p90, p99")
    for q in PERCENTILES:
        if q not in p:
            raise UserError(f"{where} {key}: field {q!r} must be a number, got None")
    return {q: _maybe(p, q, f"{where} {key}") for q in PERCENTILES}


@dataclass(frozen=True, kw_only=True)
class RunFigures:
    """A real run's figures beyond the contract (`tessera run --json`'s "extra" object, in this order)."""

    model: str
    steps: int  # every step served, the warm-up included
    switches: list[str]  # the switch log: "round 0: start -> throughput (queue depth 8 >= 2)"
    recoveries: list[str]  # one line per worker lost and recovered
    overlap: float  # share of transfer time hidden under compute, 0..1
    wait_s: list[float]  # per worker: seconds waiting on a receive
    busy_s: list[float]  # per worker: seconds running kernels
    kernels_by_worker: list[int]  # per worker: kernel launches over the run
    transport: str  # the workers' link backend: "gloo", ...
    link_bytes_by_link: dict[str, int]  # "0->1": bytes sent from worker 0 to worker 1
    predicted_event_step_s: float  # the step simulated kernel by kernel, mean after the warm-up
    measured_steps_s: list[float]  # every step, the warm-up included
    predicted_steps_s: list[float]  # every step, by the plan's formula
    link_model: dict[str, float]  # latency_s, bytes_per_s, cpu_s, cpu_s_per_byte measured at start-up
    dispatch_s_per_op: dict[str, float]  # step key ("prefill", "decode@8") -> median seconds per operator
    step_overhead_s: dict[str, float]  # step key -> median set-up seconds per step
    resident_weight_bytes: list[int]  # per worker
    tokens: list[list[list[int]]]  # per round, per request: the token ids emitted
    prediction_source: str  # where the prediction comes from, in words

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What a plan run for real measured (`tessera run`, or its torchrun launch): whether the workers' outputs
    equal single-process execution of the same requests, and the step time measured against predicted.
    ``extra``: the figures beyond the contract (RunFigures)."""

    devices: tuple[str, ...]
    microbatches: int
    verified: bool
    max_abs_diff: float  # largest |difference| of any output against single-process execution
    tokens_identical: bool | None  # None: the model emits no tokens (a diffusion step)
    measured_step_s: float  # mean over the steps after the first (warm-up)
    predicted_step_s: float
    throughput_tokens_per_s: float
    link_bytes: int
    extra: RunFigures = field(hash=False)

    def to_json(self) -> dict[str, Any]:
        """`tessera run --json`: the contract, then the rest under "extra"."""
        return {**self._contract(), "extra": self.extra.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        """The contract and the extra figures side by side (what benchmark rows collect)."""
        return {**self._contract(), **self.extra.to_dict()}

    def _contract(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in RUN_CONTRACT_KEYS}, "devices": list(self.devices)}
