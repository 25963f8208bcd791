"""The online switch in the engine: between a latency-oriented and a throughput-oriented schedule by queue
depth, with hysteresis, as ``tessera simulate --adaptive`` does (the same policy type and rule,
``tessera.sim.adaptive.AdaptivePolicy``: load = waiting + running requests; to throughput at ``high_load``,
back to latency at ``low_load``).

A schedule is a micro-batch count m and a placement (a worker pool). Both placements are kept resident (the
simulator's residency rule (c): both pools started before the stream, each holding its own weights and KV),
so a switch never loads weights. A switch goes:

1. decision (the load crossed a threshold): no new iteration is scheduled;
2. drain: the iterations in flight finish;
3. apply: the running requests are regrouped over the new m groups, keeping their pages
   (``Engine.reconfigure``); when the placement changes too, they go back to the queue with nothing cached
   (their KV lives on the other pool's workers; ``Engine.restart``) and the other pool takes over;
4. the first iteration on the new schedule is submitted.

Measured per switch (seconds): ``drain_s`` (1→2), ``apply_s`` (2→3, the re-placement), ``first_s`` (1→4,
the switch cost as the simulator's ``switch_s`` means it: time with nothing new started) and ``first_done_s``
(1→ that iteration's logits back; with a placement change it includes recomputing the running requests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from tessera.engine.config import EngineConfig
from tessera.engine.engine import Engine
from tessera.engine.serve import WorkerPool
from tessera.errors import UserError
from tessera.sim.adaptive import AdaptivePolicy

MODES = ("latency", "throughput")


@dataclass(frozen=True, kw_only=True)
class AdaptiveSettings:
    """``--adaptive``: the throughput schedule is the run's own (``--microbatches``, ``--placement``); the
    latency schedule runs ``latency_microbatches`` groups on ``latency_placement`` (None: the same
    placement). Thresholds in outstanding requests (None: ``high_load`` = max_num_seqs, as the simulator
    takes the latency plan's, ``low_load`` = half of it)."""

    latency_microbatches: int = 1
    latency_placement: str | None = None
    high_load: int | None = None
    low_load: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.latency_microbatches, int) or self.latency_microbatches < 1:
            raise UserError(f"--latency-microbatches {self.latency_microbatches!r} must be a positive integer")
        for k in ("high_load", "low_load"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, int) or v < 0):
                raise UserError(f"--{k.replace('_', '-')} {v!r} must be an integer >= 0")

    def policy(self, config: EngineConfig) -> AdaptivePolicy:
        return AdaptivePolicy(high_load=self.high_load if self.high_load is not None else config.max_num_seqs,
                              low_load=self.low_load)


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """One side of the switch: its micro-batch count and the pool (placement) its iterations run on."""

    microbatches: int
    pool: WorkerPool

    def __post_init__(self) -> None:
        if not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise UserError(f"microbatches={self.microbatches!r} must be a positive integer")


@dataclass
class SwitchRecord:
    """One switch, its times in seconds from the start of the stream (``*_s`` after the decision)."""

    to: str
    load: int
    decided_at_s: float
    drain_s: float | None = None
    apply_s: float | None = None
    first_s: float | None = None
    first_done_s: float | None = None
    restarted: int = 0  # running requests put back in the queue (a placement change)
    first_sid: int | None = field(default=None, repr=False)


class Switcher:
    """Driven by ``serve.drive`` (its ``switch`` argument): ``gate`` before scheduling, ``submitted`` after
    each submit, ``completed`` for each iteration back; ``pool`` is the pool iterations go to now."""

    def __init__(self, policy: AdaptivePolicy, schedules: dict[str, Schedule], *, mode: str = "latency") -> None:
        if set(schedules) != set(MODES) or mode not in MODES:
            raise UserError(f"adaptive schedules {sorted(schedules)} / mode {mode!r}: valid {', '.join(MODES)}")
        self.policy, self.schedules, self.mode = policy, schedules, mode
        self.switches: list[SwitchRecord] = []
        self.mode_s = dict.fromkeys(MODES, 0.0)  # seconds spent in each mode (a switch counts to the old)
        self._since_s = 0.0
        self._pending: SwitchRecord | None = None

    @property
    def pool(self) -> WorkerPool:
        return self.schedules[self.mode].pool

    def start(self, engine: Engine) -> None:
        """Set the engine to the starting mode's micro-batch count and placement (before any request)."""
        engine.reconfigure(replace(engine.config, microbatches=self.schedules[self.mode].microbatches))
        if self.pool.placement is not None:
            engine.placement = self.pool.placement.label

    def gate(self, engine: Engine, inflight: int, now_s: float) -> bool:
        """Whether new iterations may be scheduled now: observes the load, decides, drains, applies."""
        if self._pending is None:
            load = len(engine.scheduler.waiting) + engine.scheduler.num_running
            to = self.policy.target(self.mode, load)
            if to == self.mode:
                return True
            self._pending = SwitchRecord(to=to, load=load, decided_at_s=now_s)
        if inflight:
            return False
        self._apply(engine, now_s)
        return True

    def _apply(self, engine: Engine, now_s: float) -> None:
        a0 = time.perf_counter()
        rec = self._pending
        assert rec is not None
        rec.drain_s = now_s - rec.decided_at_s
        old, new = self.schedules[self.mode], self.schedules[rec.to]
        if new.pool is not old.pool:
            rec.restarted = engine.restart()
            if new.pool.placement is not None:
                engine.placement = new.pool.placement.label
        engine.reconfigure(replace(engine.config, microbatches=new.microbatches))
        self.mode_s[self.mode] += rec.decided_at_s - self._since_s
        self._since_s = rec.decided_at_s
        self.mode = rec.to
        self._pending = None
        self.switches.append(rec)
        rec.apply_s = time.perf_counter() - a0

    def submitted(self, sid: int, now_s: float) -> None:
        rec = self.switches[-1] if self.switches else None
        if rec is not None and rec.first_sid is None:
            rec.first_sid, rec.first_s = sid, now_s - rec.decided_at_s

    def completed(self, sid: int, now_s: float) -> None:
        rec = self.switches[-1] if self.switches else None
        if rec is not None and rec.first_sid == sid:
            rec.first_done_s = now_s - rec.decided_at_s

    def finish(self, end_s: float) -> None:
        self.mode_s[self.mode] += end_s - self._since_s
        self._since_s = end_s

    def report(self) -> SwitchReport:
        """The thresholds, each switch, time per mode, and the switch cost's median and max."""
        firsts = sorted(r.first_s for r in self.switches if r.first_s is not None)
        return SwitchReport(
            high_load=self.policy.high_load, low_load=self.policy.low_load,
            microbatches={m: s.microbatches for m, s in self.schedules.items()},
            placements={m: s.pool.placement.label if s.pool.placement else None for m, s in self.schedules.items()},
            switches=tuple(replace(r) for r in self.switches), mode_s=dict(self.mode_s),
            switch_median_s=firsts[len(firsts) // 2] if firsts else None,
            switch_max_s=firsts[-1] if firsts else None)


@dataclass(frozen=True, kw_only=True)
class SwitchReport:
    """A run's switching: thresholds (outstanding requests), micro-batches and placement label per mode,
    each switch (copies of the records), seconds per mode, and the median and max switch cost ``first_s``
    (None: no switch started an iteration)."""

    high_load: int
    low_load: int
    microbatches: dict[str, int]
    placements: dict[str, str | None]
    switches: tuple[SwitchRecord, ...]
    mode_s: dict[str, float]
    switch_median_s: float | None
    switch_max_s: float | None

    def to_dict(self) -> dict[str, object]:
        """The JSON of ``serve-run``'s ``extra.adaptive`` (a switch's ``first_sid`` is internal)."""
        return {"high_load": self.high_load, "low_load": self.low_load, "microbatches": dict(self.microbatches),
                "placements": dict(self.placements),
                "switches": [{k: v for k, v in vars(r).items() if k != "first_sid"} for r in self.switches],
                "mode_s": dict(self.mode_s),
                "switch_s": {"median": self.switch_median_s, "max": self.switch_max_s}}


def switcher_for(settings: AdaptiveSettings, config: EngineConfig, throughput_pool: WorkerPool,
                 latency_pool: WorkerPool | None = None) -> Switcher:
    """The switch of ``--adaptive``: latency mode first, on ``latency_pool`` (None: the same pool)."""
    if latency_pool is None and settings.latency_microbatches == config.microbatches:
        raise UserError(f"--adaptive: both schedules run {config.microbatches} micro-batch(es) on one placement; "
                        "give --latency-microbatches other than --microbatches, or a --latency-placement")
    if settings.latency_microbatches > config.max_num_seqs:
        raise UserError(f"--latency-microbatches {settings.latency_microbatches} must be <= --max-num-seqs "
                        f"{config.max_num_seqs}")
    return Switcher(settings.policy(config), {
        "latency": Schedule(microbatches=settings.latency_microbatches, pool=latency_pool or throughput_pool),
        "throughput": Schedule(microbatches=config.microbatches, pool=throughput_pool)})
