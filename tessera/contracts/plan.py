"""The plan files: what plan hands to sim, runtime and report (versioned JSON).

A Plan is one *cell*: a set of devices that together run one model replica under one placement
(Tessera's or a baseline's). ``replicas`` > 1 means the cell is repeated over identical devices
(homogeneous baseline: each GPU its own replica). Everything the simulator needs to time an
iteration is in ``PhasePlan.points`` so that sim never calls back into capture or cost.

A PoolPlan is a pool served by several *different* cells behind one router: cells with counts (a fleet;
the homogeneous baseline on a mixed pool, one replica per GPU type). ``read_plan_file`` tells the two
file kinds apart by content.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tessera.contracts.slo import Slo
from tessera.errors import os_error_text

PLAN_VERSION = 2  # 2: engine settings; a "mixed" phase's step points are one micro-batch's iteration


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """What an operator gives a continuous-batching engine to deploy a plan, named as vLLM names them: with
    the placement and the step costs, all that the simulator and the runtime take from a plan (they
    schedule by themselves; nothing the planner derived from these, such as a chunk size, is handed on).

    A replica runs ``microbatches`` groups of sequences that advance independently through the placement,
    each group holding at most ``group_seqs`` running sequences; one iteration of a group carries every
    decode of the group plus prompt chunks, ``max_num_batched_tokens`` tokens at most. A prefill/decode plan
    reads them per instance: the decode instance's sequences, the prefill instance's tokens per batch. An
    image plan's sequences are images in flight (its token budget is unused)."""

    max_num_seqs: int  # sequences running at once in one replica of the cell, all micro-batches together
    max_num_batched_tokens: int  # token budget of one micro-batch iteration: its decode tokens + prompt chunks
    microbatches: int = 1  # groups advancing independently through the placement

    def __post_init__(self) -> None:
        for k in ("max_num_seqs", "max_num_batched_tokens", "microbatches"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"engine setting {k}={v!r} must be an integer >= 1")
        if self.microbatches > self.max_num_seqs:
            raise ValueError(f"engine settings: {self.microbatches} micro-batches need at least as many "
                             f"sequences, max_num_seqs={self.max_num_seqs}")

    @property
    def group_seqs(self) -> int:
        """Running sequences one micro-batch (group) holds at most."""
        return -(-self.max_num_seqs // self.microbatches)


@dataclass(frozen=True, kw_only=True)
class PlanWorkload:
    """What a plan was made for, as its file records it (``Plan.workload``): the planner writes every field
    (its traffic and the batch it chose), a hand-written plan any of them; None is a field the file does not
    name, and its JSON leaves it out. Lengths in tokens; ``steps`` are an image's denoising steps."""

    batch: int | None = None  # sequences (images) in flight per cell at the operating point
    prompt: int | None = None  # prompt tokens per request
    output: int | None = None  # output tokens per request
    steps: int | None = None  # denoising steps per image (diffusion)
    image_tokens: int | None = None  # of the prompt, one image's tokens (a VLM)

    def __post_init__(self) -> None:
        for k in ("batch", "prompt", "output", "steps", "image_tokens"):
            v, least = getattr(self, k), 0 if k == "image_tokens" else 1
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < least):
                raise ValueError(f"plan workload {k}={v!r} must be an integer >= {least}")

    def to_dict(self) -> dict[str, int]:
        return _given(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> PlanWorkload:
        return cls(**_known(d, cls, "plan workload"))


@dataclass(frozen=True, kw_only=True)
class PlanSlo:
    """The SLO a plan was made under (a ``Slo``), as its file records it (``Plan.slo``): the planner writes
    every field (``of``), a hand-written plan any of them; None is a field the file does not name, and its
    JSON leaves it out. Latencies in seconds; ``target`` the share of requests that must meet them."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    image_s: float | None = None
    target: float | None = None

    def __post_init__(self) -> None:
        for k in ("ttft_s", "tpot_s", "image_s"):
            v = getattr(self, k)
            if v is not None and not (_number(v) and v > 0 and math.isfinite(v)):
                raise ValueError(f"plan SLO {k}={v!r} must be a positive number of seconds")
        if self.target is not None and not (_number(self.target) and 0 < self.target <= 1):
            raise ValueError(f"plan SLO target={self.target!r} must be a share of requests in (0, 1]")

    @classmethod
    def of(cls, slo: Slo) -> PlanSlo:
        return cls(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s, image_s=slo.image_s, target=slo.target)

    def to_dict(self) -> dict[str, float]:
        return _given(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> PlanSlo:
        return cls(**_known(d, cls, "plan SLO"))


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _given(record: PlanWorkload | PlanSlo) -> dict[str, Any]:
    """A record's fields that are not None, in declaration order (the planner's files list every one in this
    order): what a hand-written plan leaves out stays out of the JSON, and so of the fingerprint."""
    return {f.name: getattr(record, f.name) for f in fields(record) if getattr(record, f.name) is not None}


def _known(d: dict[str, Any] | None, cls: type, what: str) -> dict[str, Any]:
    """``d`` (a JSON object; null or absent: empty) checked to name only ``cls``'s fields."""
    d = {} if d is None else d
    if not isinstance(d, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(d).__name__}")
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(d) - set(valid))
    if unknown:
        raise ValueError(f"unknown {what} field {unknown[0]!r}; valid: {', '.join(valid)}")
    return d


@dataclass(frozen=True, kw_only=True)
class Segment:
    """A stretch of one micro-batch's iteration through the placement, in program order: a run of kernels on
    ``device`` (``to`` None), or the values crossing the directed link ``device`` → ``to``. ``share`` is the
    stretch's fraction of that device's (that link's) busy seconds in one iteration at the operating point,
    so a consumer can split the busy seconds of any step point into the route's stretches."""

    device: int
    to: int | None = None
    share: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0 + 1e-9:
            raise ValueError(f"route segment share={self.share} must be within [0, 1]")


@dataclass(frozen=True, kw_only=True)
class Device:
    index: int
    gpu: str  # catalog name, e.g. "H100-SXM"; "cpu" for the measured local CPU
    mem_bytes: int  # capacity


@dataclass(frozen=True, kw_only=True)
class StepPoint:
    """Cost of one step of a phase at one shape under the phase's placement.

    Times are per *micro-batch* except ``step_s`` (the whole step with ``microbatches`` in flight):
    step_s = max(m·T, latency_s), T = max(device_busy_s ∪ link_busy_s), the asynchronous period, for a
    serving plan's phase (its latency for a phase of one micro-batch).

    In a "mixed" phase (the serving model's iteration) a point is *one micro-batch's* iteration: ``batch``
    decode sequences of that group and ``tokens`` = those decodes + its prompt-chunk tokens, at mean decode
    context ``context``; ``step_s`` is then the period if all ``microbatches`` groups ran that shape. In the
    other phases ``batch`` and ``tokens`` count the whole step (all micro-batches).
    """

    batch: int  # sequences: the whole step's, or one micro-batch's in a "mixed" phase (see above)
    tokens: int  # tokens the step processes (prefill: Σ prompt tokens; decode: batch; mixed: decode + chunk)
    context: int  # KV length attended to (decode); prompt length (prefill); 0 otherwise
    microbatches: int
    device_busy_s: tuple[float, ...]  # [D] compute per micro-batch
    link_busy_s: tuple[tuple[int, int, float], ...]  # (src, dst, seconds) per micro-batch, directed
    latency_s: float  # one micro-batch, first kernel to last, transfers included
    step_s: float


@dataclass(frozen=True, kw_only=True)
class PhasePlan:
    phase: str  # prefill | decode | denoise | encode
    assignment: tuple[int, ...]  # kernel id (of the phase's captured graph) -> device index
    microbatches: int
    points: tuple[StepPoint, ...]  # sampled shapes; sim interpolates between them
    graph_shape: dict[str, int] = field(default_factory=dict, hash=False)  # shape the graph was captured at
    route: tuple[Segment, ...] = ()  # one micro-batch's path through the devices at the operating point


@dataclass(frozen=True, kw_only=True)
class Plan:
    version: int = PLAN_VERSION
    model: str
    strategy: str  # tessera | homogeneous | prefill_decode | attention_ffn | layer_pipeline
    mode: str  # throughput | latency
    devices: tuple[Device, ...]
    link: str  # catalog link name between the cell's devices
    replicas: int = 1
    phases: dict[str, PhasePlan] = field(hash=False)
    # Memory placement: bytes resident per device, by role (weight, kv, state, activation).
    memory_bytes: tuple[dict[str, int], ...] = field(hash=False)
    kv_bytes_per_token: int = 0  # KV (+ state) bytes one token of one sequence adds, whole model
    kv_capacity_tokens: int = 0  # tokens of KV the cell can hold after weights and activations
    throughput_tokens_per_s: float | None = None  # steady-state prediction, whole plan (all replicas)
    throughput_images_per_s: float | None = None  # diffusion
    latency_s: float | None = None
    usd_per_hour: float = 0.0
    usd_per_million_tokens: float | None = None
    bound_ratio: float | None = None  # LP bound / the planner's objective for this plan, <= 1 (docs/plan.md)
    solve_s: float = 0.0
    workload: PlanWorkload = field(default_factory=PlanWorkload)
    notes: tuple[str, ...] = ()
    # The serving model's operating point (docs/plan.md): batch in flight per cell and micro-batches, the
    # predicted TPOT (the period) and TTFT, the throughput of the synchronous schedule on the same
    # placement, the busy fraction of each device, and the SLO the point was chosen under.
    batch: int = 0
    microbatches: int = 0
    tpot_s: float | None = None
    ttft_s: float | None = None
    sync_throughput: float | None = None
    device_busy: tuple[float, ...] = ()
    slo: PlanSlo = field(default_factory=PlanSlo)
    engine: EngineSettings | None = None  # the deployment's engine settings (None: a plan with no engine)
    # the planner's goodput: output tokens/s (images/s) at the highest arrival rate at which the SLO's target
    # share of requests meets it (all replicas); a simulator's SLO knee is what checks it
    goodput_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"plan replicas={self.replicas} must be >= 1")
        n = len(self.devices)
        for p in self.phases.values():
            assert all(0 <= d < n for d in p.assignment), f"phase {p.phase}: device index out of range"

    def to_dict(self) -> dict[str, Any]:
        # the SLO and workload leave out the fields a hand-written plan does not name (keys keep their place)
        return {**asdict(self), "workload": self.workload.to_dict(), "slo": self.slo.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        if not isinstance(d, dict):
            raise ValueError(f"plan must be a JSON object, got {type(d).__name__}")
        if "cells" in d:
            raise ValueError("it is a pool plan (cells with counts), not one cell's plan")
        if d.get("members"):
            raise ValueError("it is an old plan of independent replicas (\"members\"): read it with "
                             "read_plan_file, which turns it into the pool plan it describes")
        if d.get("version") != PLAN_VERSION:
            older = isinstance(d.get("version"), int) and d["version"] < PLAN_VERSION
            raise ValueError(f"plan version {d.get('version')!r} is not {PLAN_VERSION}" + (
                " (written by an older Tessera, whose step points mean whole steps: write it again with "
                "`tessera plan ... -o FILE`)" if older else ""))
        phases = {
            name: PhasePlan(
                phase=p["phase"], assignment=tuple(p["assignment"]), microbatches=p["microbatches"],
                graph_shape=dict(p.get("graph_shape", {})),
                route=tuple(Segment(**x) for x in p.get("route", ())),
                points=tuple(
                    StepPoint(**{**s, "device_busy_s": tuple(s["device_busy_s"]),
                                 "link_busy_s": tuple(tuple(x) for x in s["link_busy_s"])})
                    for s in p["points"]
                ),
            )
            for name, p in d["phases"].items()
        }
        # "members" (always empty here) is what plan files before the pool plan carried
        rest = {k: v for k, v in d.items()
                if k not in ("phases", "devices", "memory_bytes", "notes", "members", "device_busy", "engine",
                             "workload", "slo")}
        engine = EngineSettings(**d["engine"]) if d.get("engine") is not None else None
        return cls(
            **rest, phases=phases, devices=tuple(Device(**x) for x in d["devices"]), engine=engine,
            workload=PlanWorkload.from_dict(d.get("workload")), slo=PlanSlo.from_dict(d.get("slo")),
            memory_bytes=tuple(dict(m) for m in d["memory_bytes"]), notes=tuple(d.get("notes", ())),
            device_busy=tuple(d.get("device_busy", ())),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, AssertionError) as e:
            raise ValueError(f"cannot read plan {path}: {e}") from None


POOL_PLAN_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class PoolCell:
    """``count`` independent copies of one cell ``plan`` (each copy itself ``plan.replicas`` replicas)."""

    plan: Plan
    count: int

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"pool cell count={self.count!r} must be an integer >= 1")


@dataclass(frozen=True, kw_only=True)
class PoolPlan:
    """A pool served by several *different* cells behind one router (a fleet; the homogeneous baseline on a
    mixed pool). Headline figures are sums over cells × count × replicas."""

    version: int = POOL_PLAN_VERSION
    cells: tuple[PoolCell, ...]

    def __post_init__(self) -> None:
        if not self.cells:
            raise ValueError("a pool plan needs at least one cell")
        models = sorted({c.plan.model for c in self.cells})
        if len(models) > 1:
            raise ValueError(f"a pool plan serves one model, got {', '.join(models)}")
        kinds = {c.plan.throughput_images_per_s is not None for c in self.cells}
        if len(kinds) > 1:
            raise ValueError("a pool plan's cells must all serve images or all serve tokens")

    @classmethod
    def of(cls, plan: Plan | PoolPlan, count: int = 1) -> PoolPlan:
        """Either file kind as a pool: a pool plan itself (``count`` times over), or one cell's plan."""
        if isinstance(plan, PoolPlan):
            return cls(cells=tuple(PoolCell(plan=c.plan, count=c.count * count) for c in plan.cells))
        return cls(cells=(PoolCell(plan=plan, count=count),))

    def relabelled(self, strategy: str) -> PoolPlan:
        """The same pool with every cell's plan labelled ``strategy`` (Tessera adopting a baseline's pool)."""
        return replace(self, cells=tuple(replace(c, plan=replace(c.plan, strategy=strategy)) for c in self.cells))

    @property
    def lead(self) -> Plan:
        """The first cell's plan (homogeneous puts its fastest cell first): what pictures of one cell show."""
        return self.cells[0].plan

    @property
    def model(self) -> str:
        return self.lead.model

    @property
    def strategy(self) -> str:
        return self.lead.strategy

    @property
    def replicas(self) -> int:
        """Independent replicas behind the router: every cell's count × its plan's own replicas."""
        return sum(c.count * c.plan.replicas for c in self.cells)

    @property
    def images(self) -> bool:
        return self.cells[0].plan.throughput_images_per_s is not None

    @property
    def throughput_per_s(self) -> float:
        """Output tokens/s (images/s): the plans' own predictions of their capacity (which already count their
        replicas); a goodput at the SLO is at most this."""
        def one(p: Plan) -> float:
            return (p.throughput_images_per_s if self.images else p.throughput_tokens_per_s) or 0.0

        return sum(c.count * one(c.plan) for c in self.cells)

    @property
    def usd_per_hour(self) -> float:
        return sum(c.count * c.plan.usd_per_hour for c in self.cells)

    def sim_cells(self) -> list[tuple[Plan, int]]:
        """``[(plan, count)]``: what tessera.sim's simulate_pool and run_pool take."""
        return [(c.plan, c.count) for c in self.cells]

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "cells": [{"count": c.count, "plan": c.plan.to_dict()} for c in self.cells]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PoolPlan:
        if not isinstance(d, dict) or d.get("version") != POOL_PLAN_VERSION:
            raise ValueError(f"pool plan version {d.get('version') if isinstance(d, dict) else d!r} is not "
                             f"{POOL_PLAN_VERSION}")
        return cls(cells=tuple(PoolCell(plan=Plan.from_dict(c["plan"]), count=c["count"]) for c in d["cells"]))

    @classmethod
    def from_members(cls, d: dict[str, Any]) -> PoolPlan:
        """An old plan file's "members" (independent replicas of different cells, each a Plan with its own
        replicas) as the pool plan it describes: one cell per member, count 1."""
        return cls(cells=tuple(PoolCell(plan=Plan.from_dict(m), count=1) for m in d["members"]))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> PoolPlan:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, AssertionError) as e:
            raise ValueError(f"cannot read pool plan {path}: {e}") from None


def plan_from_dict(d: Any) -> Plan | PoolPlan:
    """Either file kind, told apart by content: "cells" is a pool plan, "phases" one cell's plan (an old
    file whose "members" are independent replicas of different cells is read as that pool plan)."""
    if not isinstance(d, dict):
        raise ValueError(f"a plan file holds a JSON object, not a JSON {type(d).__name__}")
    if "cells" in d:
        return PoolPlan.from_dict(d)
    if "phases" in d:
        return PoolPlan.from_members(d) if d.get("members") else Plan.from_dict(d)
    raise ValueError("it is neither a plan (no \"phases\") nor a pool plan (no \"cells\"); "
                     "write one with `tessera plan MODEL --gpus A,B -o FILE`")


def read_plan_file(path: str | Path) -> Plan | PoolPlan:
    """The plan or pool plan in ``path`` (either file kind); any problem is one ValueError line."""
    try:
        return plan_from_dict(json.loads(Path(path).read_text()))
    except json.JSONDecodeError as e:
        raise ValueError(f"cannot read plan {path}: not JSON ({e.msg}, line {e.lineno})") from None
    except UnicodeDecodeError:
        raise ValueError(f"cannot read plan {path}: not a text file") from None
    except OSError as e:
        raise ValueError(f"cannot read plan {path}: {os_error_text(e)}") from None
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError) as e:
        msg = f"missing field {e}" if isinstance(e, KeyError) else (str(e).splitlines() or [type(e).__name__])[0]
        raise ValueError(f"cannot read plan {path}: {msg}") from None
