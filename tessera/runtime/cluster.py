"""The driver side: start one worker per device, hand out steps, detect dead or hung workers.

A failure (a worker that exits, stops beating, reports an error or overruns a step) ends the run: the
driver names the worker and the reason, stops every other worker (SIGTERM, then SIGKILL) and raises
WorkerFailure, all within a few seconds, leaving no process behind.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as mp

from tessera.errors import UserError
from tessera.graph import Role
from tessera.runtime.device import choose_backend, torch_device
from tessera.runtime.partition import Partition
from tessera.runtime.program import CapturedProgram, from_wire, to_wire
from tessera.runtime.worker import PartitionWorkerSpec, StepCmd, worker_main
from tessera.text import plural


class WorkerFailure(RuntimeError):
    """A worker died, hung or failed; the message names it and the reason."""

    detail: str = ""
    rank: int = -1  # the worker at fault (its index in ClusterConfig.devices)


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    devices: tuple[str, ...]  # "cpu" or "cuda:N", one worker each
    threads: int = 1  # intra-op threads per worker (exact verification needs the reference's count)
    recv_timeout_s: float = 5.0
    heartbeat_timeout_s: float = 2.0  # silent this long and stopped by a signal: named at once
    wedged_timeout_s: float = 10.0  # silent this long whatever its state: named as wedged
    step_timeout_s: float = 60.0
    start_timeout_s: float = 120.0
    weights_dir: str | None = None
    max_microbatches: int = 1
    transport: str = "auto"  # auto | gloo | nccl (device.choose_backend)
    # issue in NCCL's global order even on gloo (where every message then carries tag 0): checks that
    # schedule's pairing without a GPU. None: ordered exactly when the backend is NCCL
    ordered: bool | None = None

    def __post_init__(self) -> None:
        if len(self.devices) < 1:
            raise UserError("--devices is empty; give one or more of: cpu, cuda:N")
        bad = [d for d in self.devices if d != "cpu" and not d.startswith("cuda")]
        if bad:
            raise UserError(f"unknown device {bad[0]!r}; valid: cpu, cuda, cuda:N")
        if len({d == "cpu" for d in self.devices}) > 1:
            raise UserError(f"devices {','.join(self.devices)} mix cpu and cuda; one backend per run")
        if any(d.startswith("cuda") for d in self.devices):
            if not torch.cuda.is_available():
                raise UserError("cuda devices requested but this torch build sees no GPU; valid here: cpu")
            n = torch.cuda.device_count()
            for d in self.devices:
                if torch_device(d).index >= n:
                    raise UserError(f"device {d} does not exist; valid: cpu, " +
                                    ", ".join(f"cuda:{i}" for i in range(n)))
        if choose_backend(self.devices, self.transport)[0] == "nccl" and self.ordered is False:
            raise UserError("NCCL needs the ordered schedule; valid: ordered=None or True")
        for what, v in (("threads", self.threads), ("max_microbatches", self.max_microbatches)):
            if v < 1:
                raise UserError(f"{what}={v} must be >= 1")
        for what, f in (("recv_timeout_s", self.recv_timeout_s), ("heartbeat_timeout_s", self.heartbeat_timeout_s),
                        ("step_timeout_s", self.step_timeout_s)):
            if f <= 0:
                raise UserError(f"{what}={f} must be > 0")

    @property
    def backend(self) -> str:
        return choose_backend(self.devices, self.transport)[0]

    @property
    def ordered_issue(self) -> bool:
        return choose_backend(self.devices, self.transport)[1] if self.ordered is None else self.ordered


# A starting worker loads and traces between beats of its heartbeat thread; silent this long after its
# first beat, it is wedged (a stopped one is named sooner, from its process state).
START_SILENCE_S = 10.0


def process_stopped(pid: int | None) -> bool:
    """Whether ``pid`` is stopped by a signal (SIGSTOP, SIGTSTP, a tracer): state T or t in
    /proc/PID/stat (Linux); False where that cannot be read."""
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 (one short read)
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][:1] in ("T", "t")  # the state follows the command name's ")"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored in this process meanwhile (processes started meanwhile inherit it); a no-op off the
    main thread, where Python cannot set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return f"died: killed by {signal.Signals(-code).name}"
    return f"died: exited with status {code}"


def worker_specs(programs: dict[str, CapturedProgram], partitions: dict[tuple[str, str], Partition],
                 config: ClusterConfig) -> list[PartitionWorkerSpec]:
    """Each device's share: programs stripped to its KV/state/input starting contents, its weights by name."""
    specs = []
    for d, device in enumerate(config.devices):
        keep: dict[str, set[int]] = {k: set() for k in programs}
        weights: dict[str, torch.Tensor] = {}
        for (key, _), part in partitions.items():
            prog = programs[key]
            for b in part.resident[d] | part.inputs[d]:
                if prog.role(b) is Role.WEIGHT:
                    if config.weights_dir is None:
                        weights.setdefault(prog.name(b), prog.initial[b])
                else:
                    keep[key].add(b)
        specs.append(PartitionWorkerSpec(
            rank=d, world=len(config.devices), device=device, backend=config.backend,
            ordered=config.ordered_issue, threads=config.threads,
            recv_timeout_s=config.recv_timeout_s, programs={k: p.stripped(keep[k]) for k, p in programs.items()},
            partitions=partitions, weights=weights, weights_dir=config.weights_dir,
            max_microbatches=config.max_microbatches))
    return specs


@dataclass(frozen=True, kw_only=True)
class Watch:
    """What Processes reads of its config (ClusterConfig has the same fields): the devices, one process
    each, and the fault timeouts in seconds."""

    devices: tuple[str, ...]
    heartbeat_timeout_s: float = 2.0
    wedged_timeout_s: float = 10.0
    step_timeout_s: float = 60.0
    start_timeout_s: float = 120.0


class Processes:
    """One spawned process per device, watched: a heartbeat slot each, a result queue, fault naming.

    ``spawn(target, specs)`` starts ``target(rank, commands, results, heartbeat, parent)`` per spec; the
    spec itself travels through the rank's command queue (a feeder thread writes it), so the driver never
    blocks writing into the pipe of a worker that stopped before reading it. ``ready()`` waits for every
    worker's "ready" message within ``start_timeout_s``, naming any worker that exits, stops (its process
    state says so) or stops beating meanwhile. ``config``: a Watch, or anything with its fields."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.procs: list[Any] = []
        self._inflight: dict[int, tuple[float, dict[int, Any]]] = {}  # submitted step -> (when, rank -> result)
        self._closed = False

    def spawn(self, target: Any, specs: list[Any], name: str = "tessera-worker") -> None:
        ctx = mp.get_context("spawn")
        n = len(specs)
        self.results = ctx.Queue()
        # Queue, not SimpleQueue: a feeder thread writes the pipe, so a stopped worker that stops reading
        # blocks that thread, never the driver's fault checks (SimpleQueue writes in the caller)
        self.commands = [ctx.Queue() for _ in range(n)]
        self.heartbeat = ctx.Array("d", [0.0] * n, lock=False)  # 0: not beaten yet
        self.spawned_at = time.monotonic()
        saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        try:
            # Ctrl-C reaches the whole process group: workers are born ignoring SIGINT (an ignored signal
            # stays ignored through exec, and Python then installs no KeyboardInterrupt handler), so the
            # driver alone hears it and stops them (close)
            with sigint_ignored():
                procs = [ctx.Process(target=target, daemon=True, name=f"{name}-{rank}",
                                     args=(rank, self.commands[rank], self.results, self.heartbeat, os.getpid()))
                         for rank in range(n)]
                for p in procs:
                    p.start()
            for rank, spec in enumerate(specs):
                self.procs.append(procs[rank])
                self.commands[rank].put(spec)
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)

    def ready(self) -> dict[int, Any]:
        """Every worker's "ready" payload, by rank."""
        return self._collect("ready", self.config.start_timeout_s, beats=False)

    def _starting_fault(self, r: int, now: float) -> str | None:
        """Why worker ``r``, still starting, is lost: stopped by a signal (its process state says so once
        it has been silent for a heartbeat timeout), or silent for START_SILENCE_S after its first beat
        (wedged); None while it is fine. Before its first beat a worker is importing (seconds)."""
        beat = self.heartbeat[r]
        silent = now - (beat or self.spawned_at)
        if silent > self.config.heartbeat_timeout_s and process_stopped(self.procs[r].pid):
            return f"stopped during start-up (process state T, silent for {silent:.1f} s)"
        if beat and silent > START_SILENCE_S:
            return f"stopped answering during start-up: no heartbeat for {silent:.1f} s"
        return None

    def poll(self, timeout_s: float) -> dict[int, list[dict]]:
        """Submitted steps every worker has finished (waiting up to ``timeout_s`` for one): step id -> each
        worker's result (``_finished`` turns them into what the caller reads). A dead, silent, failing or
        overrunning worker raises WorkerFailure."""
        finished: dict[int, list[dict]] = {}
        deadline = time.monotonic() + timeout_s
        while self._inflight and not finished:
            try:
                msg = self.results.get(timeout=min(0.05, max(0.0, deadline - time.monotonic())) or 1e-3)
            except queue.Empty:
                msg = None
            if msg is not None and msg[0] == "error":
                self._fail(msg[1], f"failed: {msg[2]}", msg[3])
            if msg is not None and msg[0] == "done":
                sid = msg[2]["step_id"]
                got = self._inflight[sid][1]
                got[msg[1]] = msg[2]
                if len(got) == len(self.procs):
                    del self._inflight[sid]
                    finished[sid] = self._finished([got[r] for r in range(len(self.procs))])
            self._check_alive()
            if time.monotonic() >= deadline:
                break
        return finished

    def _finished(self, per_worker: list[dict]) -> list[dict]:
        return per_worker

    def _send(self, cmd: Any, step_id: int) -> None:
        """Queue ``cmd`` on every worker, in flight as step ``step_id`` until all report it done."""
        self._inflight[step_id] = (time.monotonic(), {})
        for q in self.commands:
            q.put(cmd)

    def _silent(self, r: int, now: float) -> str | None:
        """Why worker ``r``'s heartbeat counts as lost: silent past the heartbeat timeout and stopped by a
        signal (its process state T), or silent past the wedge timeout whatever its state (a loaded machine
        stalls a live worker for seconds now and then: memory reclaim, a long uninterruptible wait); None
        while it beats."""
        silent = now - self.heartbeat[r]
        if silent > self.config.heartbeat_timeout_s and process_stopped(self.procs[r].pid):
            return f"stopped answering: no heartbeat for {silent:.1f} s (process state T: stopped by a signal)"
        if silent > max(self.config.heartbeat_timeout_s, self.config.wedged_timeout_s):
            return f"stopped answering: no heartbeat for {silent:.1f} s"
        return None

    def _check_alive(self) -> None:
        now = time.monotonic()
        for r, p in enumerate(self.procs):
            if p.exitcode is not None:
                self._fail(r, _exit_reason(p.exitcode))
            silent = self._silent(r, now) if self._inflight else None
            if silent is not None:
                self._fail(r, silent, hung=True)
        for when, got in self._inflight.values():
            late = [r for r in range(len(self.procs)) if r not in got]
            if late and now - when > self.config.step_timeout_s:
                self._fail(late[0], f"did not finish a step within {self.config.step_timeout_s:g} s")

    def _collect(self, kind: str, timeout_s: float, *, beats: bool) -> dict[int, Any]:
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < len(self.procs):
            try:
                msg = self.results.get(timeout=0.05)
            except queue.Empty:
                msg = None
            if msg is not None and msg[0] == "error":
                self._fail(msg[1], f"failed: {msg[2]}", msg[3])
            if msg is not None and msg[0] == kind:
                got[msg[1]] = msg[2]
            now = time.monotonic()
            for r, p in enumerate(self.procs):
                if r in got:
                    continue
                if p.exitcode is not None:
                    self._fail(r, _exit_reason(p.exitcode))
                silent = self._silent(r, now) if beats else None
                if silent is not None:
                    self._fail(r, silent, hung=True)
                starting = None if beats else self._starting_fault(r, now)
                if starting is not None:
                    self._fail(r, starting, hung=True)
                if now > deadline:
                    self._fail(r, f"did not finish ({kind}) within {timeout_s:g} s")
        return got

    def _fail(self, rank: int, reason: str, detail: str = "", *, hung: bool = False) -> None:
        """Find the root cause (a peer's death shows up as others' receive errors), stop all, raise.

        hung: the worker is alive but silent (stopped, wedged); SIGTERM would sit pending on a stopped
        process, so it is SIGKILLed at once rather than after the others' grace period."""
        alive = [p.is_alive() for p in self.procs]  # at detection: later, peers exit on their own errors
        if hung and alive[rank]:
            self.procs[rank].kill()
        time.sleep(0.3)  # let a killed peer's exit status and a failing worker's report land
        errors: dict[int, tuple[str, str]] = {}
        while True:
            try:
                msg = self.results.get_nowait()
            except (queue.Empty, OSError, ValueError):
                break
            if msg[0] == "error":
                errors.setdefault(msg[1], (msg[2], msg[3]))
        killed = [r for r, p in enumerate(self.procs)  # by a signal, not by us (the hung one)
                  if p.exitcode is not None and p.exitcode < 0 and not (hung and r == rank)]
        if killed and rank not in killed:
            rank, reason = killed[0], _exit_reason(self.procs[killed[0]].exitcode)
        elif rank not in killed and rank in errors and not detail:
            reason, detail = f"failed: {errors[rank][0]}", errors[rank][1]
        pid = self.procs[rank].pid
        others = sum(1 for r, a in enumerate(alive) if r != rank and a)
        self.abort()
        err = WorkerFailure(f"worker {rank} ({self.config.devices[rank]}, pid {pid}) {reason}; "
                            f"stopped {plural(others, 'other worker')}")
        err.detail = detail  # the worker's traceback, for --verbose / debugging
        err.rank = rank
        raise err

    def abort(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        t0 = time.monotonic()
        for p in self.procs:
            p.join(timeout=max(0.1, 2.0 - (time.monotonic() - t0)))
        for p in self.procs:
            if p.is_alive():  # SIGTERM does not reach a stopped (SIGSTOP) or wedged process
                p.kill()
                p.join(timeout=2.0)
        self._close_queues()

    def close(self) -> None:
        """Ask every worker to finish and wait for it; while a KeyboardInterrupt (Ctrl-C) propagates
        through the caller's ``with`` or ``finally``, stop them at once instead."""
        if self._closed:  # a failure already stopped every worker and closed the queues
            return
        if isinstance(sys.exc_info()[1], KeyboardInterrupt):
            self.abort()
            return
        if not any(p.is_alive() for p in self.procs):
            self._close_queues()
            return
        for q in self.commands:
            q.put(None)
        for p in self.procs:
            p.join(timeout=5.0)
        self.abort()

    def _close_queues(self) -> None:
        self._closed = True
        for q in [*getattr(self, "commands", []), *([self.results] if hasattr(self, "results") else [])]:
            q.close()
            q.cancel_join_thread()


class Cluster(Processes):
    """``with Cluster(...) as c: c.step(key, plan, inputs, reset)``; workers are spawned on entry."""

    def __init__(self, programs: dict[str, CapturedProgram], partitions: dict[tuple[str, str], Partition],
                 config: ClusterConfig) -> None:
        super().__init__(config)
        self.programs, self.partitions = programs, partitions
        self.resident: list[dict[str, int]] = []  # per worker: weight name -> bytes it holds
        self.history: list[dict[str, Any]] = []  # per step: key, plan, m, and each worker's events
        self._next_step = 0

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self.spawn(worker_main, worker_specs(self.programs, self.partitions, self.config))
        got = self.ready()
        self.resident = [got[r]["weights"] for r in range(len(self.procs))]
        self.link = got[0]["link"]  # (latency_s, bytes_per_s) measured between workers 0 and 1, or None

    def step(self, key: str, plan: str, inputs: list[dict[int, torch.Tensor]], *, reset: bool) -> list[dict]:
        """Run one step of ``len(inputs)`` micro-batches; returns each worker's outputs and events."""
        assert len(inputs) <= self.config.max_microbatches, "more micro-batches than the workers hold state for"
        wire = tuple({b: to_wire(t) for b, t in feed.items()} for feed in inputs)
        cmd = StepCmd(step_id=self._next_step, key=key, plan=plan, inputs=wire, reset=reset)
        self._next_step += 1
        for q in self.commands:
            q.put(cmd)
        got = self._collect("done", self.config.step_timeout_s, beats=True)
        per_worker = [got[r] for r in range(len(self.procs))]
        for w in per_worker:
            w["outputs"] = {k: from_wire(v) for k, v in w["outputs"].items()}
        self.history.append(dict(key=key, plan=plan, m=len(inputs), workers=per_worker))
        return per_worker
