"""The driver's side of the engine's workers: start them, hand out iterations, get the logits back, and
name any worker that dies, stops or fails (``tessera.runtime.cluster.Processes``: spawn, heartbeats,
start-up faults, SIGTERM then SIGKILL of the others, ``WorkerFailure``).

``EngineCluster.submit`` queues one iteration on every worker without waiting and returns its id;
``poll`` returns the iterations every worker has finished, each with its logits (from the worker that
computes them) and every worker's report (busy, idle and wall seconds). Up to m iterations, one per group,
are in flight at once (``serve.drive``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tessera.engine.config import EngineConfig
from tessera.engine.devices import WorkerKind
from tessera.engine.inputs import IterationInputs
from tessera.engine.loader import ModelSource
from tessera.engine.remote import RemoteLink
from tessera.engine.shard import value_layouts
from tessera.engine.worker import IterCmd, ProfileCmd, WorkerSpec, worker_main
from tessera.errors import UserError
from tessera.runtime.cluster import Processes, Watch
from tessera.runtime.device import choose_backend
from tessera.runtime.program import from_wire, to_wire


@dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    """Transport and fault detection (seconds). ``ordered``: issue in NCCL's global order even on gloo
    (checks that schedule without a GPU); None: exactly when the backend is NCCL."""

    transport: str = "auto"  # auto | gloo | nccl (tessera.runtime.device.choose_backend)
    ordered: bool | None = None
    recv_timeout_s: float = 30.0
    heartbeat_timeout_s: float = 2.0  # silent this long and stopped by a signal (state T): named
    wedged_timeout_s: float = 10.0  # silent this long whatever its state: named
    step_timeout_s: float = 120.0
    start_timeout_s: float = 120.0
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        for k in ("recv_timeout_s", "heartbeat_timeout_s", "wedged_timeout_s", "step_timeout_s",
                  "start_timeout_s"):
            if not getattr(self, k) > 0:
                raise UserError(f"{k}={getattr(self, k)!r} must be > 0")


@dataclass(frozen=True)
class Finished:
    """An iteration every worker has finished: its logits and each worker's report."""

    logits: Tensor
    workers: list[dict[str, Any]]


class EngineCluster(Processes):
    """One worker per ``kinds`` entry, worker d running the nodes ``assignment`` gives it."""

    def __init__(self, source: ModelSource, dtype: torch.dtype, config: EngineConfig,
                 kinds: tuple[WorkerKind, ...], assignment: tuple[int, ...], *, load_format: str, seed: int,
                 settings: ClusterSettings = ClusterSettings(), link: RemoteLink | None = None) -> None:
        """``link``: run the workers on torchrun's other ranks (tessera.engine.remote) instead of spawning
        them here; the serving pool passes it, profiling clusters run on the driver's host."""
        self.devices = tuple(k.device for k in kinds)
        self.remote = link
        super().__init__(Watch(devices=self.devices, heartbeat_timeout_s=settings.heartbeat_timeout_s,
                               wedged_timeout_s=settings.wedged_timeout_s, step_timeout_s=settings.step_timeout_s,
                               start_timeout_s=settings.start_timeout_s))
        backend, ordered = choose_backend(self.devices, settings.transport)
        self.backend, self.ordered = backend, ordered if settings.ordered is None else settings.ordered
        if backend == "nccl" and not self.ordered:
            raise UserError("NCCL needs the ordered schedule; valid: ordered=None or True")
        if max(assignment, default=0) >= len(kinds):
            raise ValueError(f"assignment names worker {max(assignment)} of {len(kinds)}")
        self.kinds, self.assignment, self.settings = kinds, assignment, settings
        self.source, self.dtype, self.engine_config = source, dtype, config
        self.load_format, self.seed = load_format, seed
        self.next_id = 0
        self.link: Any = None
        self.ready_info: list[dict[str, Any]] = []

    def specs(self) -> list[WorkerSpec]:
        layouts = value_layouts(self.source.arch, self.dtype, self.engine_config.page_size)
        return [WorkerSpec(rank=r, world=len(self.kinds), device=k.device, threads=k.threads, speed=k.speed,
                           backend=self.backend, ordered=self.ordered,
                           recv_timeout_s=self.settings.recv_timeout_s, source=self.source, dtype=self.dtype,
                           config=self.engine_config, load_format=self.load_format,
                           seed=self.seed, assignment=self.assignment, layouts=layouts,
                           cuda_graphs=self.settings.cuda_graphs) for r, k in enumerate(self.kinds)]

    def __enter__(self) -> EngineCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        t0 = time.monotonic()
        if self.remote is not None:  # torchrun's rank 0: the workers are the other ranks, on their hosts
            self.remote.spawn(self, self.specs())
        else:
            self.spawn(worker_main, self.specs(), name="tessera-engine-worker")
        got = self.ready()
        self.ready_info = [got[r] for r in range(len(self.procs))]
        self.link = got[0]["link"]
        self.start_s = time.monotonic() - t0

    @property
    def resident_bytes(self) -> list[int]:
        return [r["resident_bytes"] for r in self.ready_info]

    def submit(self, inputs: IterationInputs) -> int:
        sid = self.next_id
        self.next_id += 1
        self._send(IterCmd(step_id=sid, inputs={k: to_wire(v) for k, v in inputs.as_dict().items()}), sid)
        return sid

    def start_profile(self, inputs: IterationInputs, repeats: int, min_s: float = 0.0) -> int:
        """Ask a one-worker cluster holding the whole model to time every node on ``inputs`` (``profile``
        waits for the answer; several clusters can be asked first and then waited on, so that they run at
        the same time)."""
        sid = self.next_id
        self.next_id += 1
        wire = {k: to_wire(v) for k, v in inputs.as_dict().items()}
        self._send(ProfileCmd(step_id=sid, inputs=wire, repeats=repeats, min_s=min_s), sid)
        return sid

    def profile(self, sid: int) -> dict[str, float]:
        """Median seconds per node of profile request ``sid``."""
        while True:
            done = self.poll(1.0)
            if sid in done:
                return done[sid][0]["node_s"]

    def _finished(self, per_worker: list[dict]) -> Any:
        if "node_s" in per_worker[0]:
            return per_worker
        logits = next(w["logits"] for w in per_worker if w["logits"] is not None)
        return Finished(logits=from_wire(logits), workers=per_worker)

    @property
    def inflight(self) -> int:
        return len(self._inflight)
