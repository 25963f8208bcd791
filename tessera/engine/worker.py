"""An engine worker process: its share of the model (``shard.build_share``), its nodes run per iteration.

The driver (``tessera.engine.cluster``) keeps the scheduler, sampling and stop checks and sends each
iteration's ``IterationInputs`` (small int64 tensors, as plain bytes) to every worker. A worker runs its
nodes in program order (``routes.WorkerRoute``), receiving a value from the worker that produced it right
before its first use here and sending each value it produces to the workers that use it right after;
the worker computing the logits hands them back to the driver with its "done" report.

Transport (``torch.distributed``, env:// rendezvous on 127.0.0.1): gloo between CPU workers, every
receive of an iteration posted as soon as its command arrives (gloo matches by tag; a receive posted
before its message lands is cheap), each waited on by a persistent thread (``runtime.step_threaded.
Waiters``) that wakes the worker; the worker holds every iteration it was sent at once (one per group in
flight) and runs whichever has its data, so one group's iteration computes while another's waits on a
transfer. NCCL between CUDA workers, or ``ordered``: one iteration at a time, actions issued in the one
global order NCCL needs (``routes.ordered_actions``; NCCL's own streams order the copies against
compute, so the host never waits on a receive), decode iterations' segments replayed as CUDA graphs
(``graphs``); a CUDA worker on gloo (two workers on one GPU) stages transfers through pinned host memory.

A ``cpu:speed=S`` worker idles (1/S − 1) times its compute time before each send and at the end of its
share of an iteration (``devices``). A ``ProfileCmd`` times every node of an iteration (the worker then
holds the whole model): the per-kind profile the planner prices placements with.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
from torch import Tensor

from tessera.engine.config import EngineConfig
from tessera.engine.graphs import SegmentGraphs, capturable
from tessera.engine.inputs import FIELDS
from tessera.engine.loader import ModelSource
from tessera.engine.routes import Transfer, WorkerRoute, ordered_actions, route
from tessera.engine.shard import Layout, build_share
from tessera.runtime.device import HOST, synchronize, torch_device
from tessera.runtime.probe import probe_link
from tessera.runtime.program import Wire, from_wire, to_wire
from tessera.runtime.step_threaded import Waiters
from tessera.runtime.worker import join_group, read_ahead, worker_process

STEP_TAGS = 4096  # iterations in flight are told apart by step id modulo this in the message tag


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    rank: int
    world: int
    device: str  # cpu | cuda:N
    threads: int
    speed: float  # duty cycle: 1 computes flat out
    backend: str  # gloo | nccl
    ordered: bool  # NCCL's issue order (also on gloo, every message on tag 0: how it is checked on CPU)
    recv_timeout_s: float
    source: ModelSource
    dtype: torch.dtype
    config: EngineConfig
    load_format: str
    seed: int
    assignment: tuple[int, ...]  # the worker of each program node, in node order
    layouts: dict[str, Layout] = field(hash=False)
    cuda_graphs: bool = True  # decode segments as CUDA graphs (CUDA workers on the ordered schedule)


@dataclass(frozen=True)
class IterCmd:
    step_id: int
    inputs: dict[str, Wire]  # the IterationInputs fields


@dataclass(frozen=True)
class ProfileCmd:
    """Time every node of this worker on these inputs, after one untimed run, at least ``repeats`` times and
    for at least ``min_s`` seconds (profiling workers asked together then compute side by side throughout)."""

    step_id: int
    inputs: dict[str, Wire]
    repeats: int
    min_s: float = 0.0


def tag(step_id: int, t: Transfer, ordered: bool) -> int:
    return 0 if ordered else (step_id % STEP_TAGS) << 16 | t.index


class Worker:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec, self.rank = spec, spec.rank
        self.device = torch_device(spec.device)
        self.link = self.device if spec.backend == "nccl" else HOST  # where transfer tensors live
        nodes = {n for n, d in zip(_node_names(spec), spec.assignment, strict=True) if d == spec.rank}
        share = build_share(spec.source, spec.dtype, spec.config, nodes, self.device,
                            load_format=spec.load_format, seed=spec.seed)
        self.share, self.program = share, share.program
        self.route: WorkerRoute = route(self.program, spec.assignment, spec.rank)
        self.nodes = [self.program.kernels[i] for i in self.route.nodes]
        self.actions = ordered_actions(self.program, self.route) if spec.ordered else ()
        self.graphs = SegmentGraphs(self.program) if self.device.type == "cuda" and spec.cuda_graphs else None
        self.waiters = Waiters()
        self.wake = threading.Condition()
        self.unsent: list[tuple[Any, Tensor]] = []  # the previous finished iteration's sends

    # ---- transfers -------------------------------------------------------------------------------

    def buffer(self, t: Transfer, inputs: dict[str, Tensor]) -> Tensor:
        """The landing buffer of transfer ``t`` (bytes), sized from the iteration's token counts."""
        lay = self.spec.layouts[t.value]
        shape = lay.shape(inputs["input_ids"].shape[0], inputs["logits_indices"].shape[0])
        n = torch.Size(shape).numel() * torch.empty(0, dtype=lay.dtype).element_size()
        return torch.empty(n, dtype=torch.uint8, device=self.link, pin_memory=self._pinned())

    def _pinned(self) -> bool:
        return self.link.type == "cpu" and self.device.type == "cuda"

    def landed(self, t: Transfer, buf: Tensor, inputs: dict[str, Tensor]) -> Tensor:
        lay = self.spec.layouts[t.value]
        shape = lay.shape(inputs["input_ids"].shape[0], inputs["logits_indices"].shape[0])
        value = buf.view(lay.dtype).view(shape)
        return value.to(self.device, non_blocking=True) if value.device != self.device else value

    def outgoing(self, value: Tensor) -> Tensor:
        """The bytes a send hands the transport: on the link's device (pinned host staging for a CUDA worker
        on gloo, the copy finished before gloo's thread reads it)."""
        data = value.detach().contiguous().view(torch.uint8).reshape(-1)
        if self.link == self.device:
            return data
        host = torch.empty(data.shape, dtype=torch.uint8, pin_memory=True)
        host.copy_(data, non_blocking=True)
        synchronize(self.device)
        return host

    def post(self, cmd: Any) -> dict[int, tuple[Tensor, Any]] | None:
        """An iteration's receives, posted ahead of running it (gloo); None on the ordered schedule."""
        if self.spec.ordered or not isinstance(cmd, IterCmd):
            return None
        inputs = {k: from_wire(v) for k, v in cmd.inputs.items()}
        out = {}
        for t in self.route.incoming:
            buf = self.buffer(t, inputs)
            out[t.index] = (buf, dist.irecv(buf, src=t.src, tag=tag(cmd.step_id, t, False)))
        return out

    def flush_sends(self) -> None:
        for work, _ in self.unsent:
            work.wait(datetime.timedelta(seconds=self.spec.recv_timeout_s))
        self.unsent = []

    def fetch(self, a: fx.Node, inputs: dict[str, Tensor], store: dict[str, Tensor]) -> Tensor:
        if a.op == "placeholder":
            return inputs[str(a.target)]
        return self.program.attr(a) if a.op == "get_attr" else store[a.name]

    def call(self, node: fx.Node, inputs: dict[str, Tensor], store: dict[str, Tensor]) -> Tensor:
        def get(a: fx.Node) -> Tensor:
            return self.fetch(a, inputs, store)
        return self.program.call(node, fx.node.map_arg(node.args, get), fx.node.map_arg(node.kwargs, get))

    def inputs_of(self, cmd: Any) -> dict[str, Tensor]:
        return {k: from_wire(cmd.inputs[k]).to(self.device) for k in FIELDS}


class Duty:
    """The duty cycle of a ``speed`` < 1 worker: idle time owed for compute done, paid before results
    leave the worker."""

    def __init__(self, speed: float) -> None:
        self.factor = 1.0 / speed - 1.0
        self.owed_s = 0.0
        self.paid_s = 0.0

    def computed(self, seconds: float) -> None:
        self.owed_s += seconds * self.factor

    def pay(self) -> None:
        if self.owed_s > 0:
            t0 = time.perf_counter()
            time.sleep(self.owed_s)
            self.paid_s += time.perf_counter() - t0
            self.owed_s = 0.0


class WorkerIteration:
    """One iteration on a gloo worker that holds several at once: ``advance`` runs every node whose
    data is there; receives are waited on by a Waiters thread (lane ``lane``) that wakes the worker."""

    def __init__(self, w: Worker, cmd: IterCmd, posted: dict[int, tuple[Tensor, Any]] | None,
                 lane: int) -> None:
        self.w, self.step_id, self.lane = w, cmd.step_id, lane
        self.start_s = time.perf_counter()
        self.inputs = w.inputs_of(cmd)
        posted = posted if posted is not None else w.post(cmd)
        self.pending = {i: buf for i, (buf, _) in posted.items()}
        self.done: set[int] = set()
        self.errors: list[str] = []
        self.store: dict[str, Tensor] = {}
        self.sent: list[tuple[Any, Tensor]] = []
        self.cursor = 0
        self.busy_s = 0.0
        self.duty = Duty(w.spec.speed)
        works = [(t, posted[t.index][1]) for t in w.route.incoming]
        if works:
            w.waiters.run(lane, lambda: self._receive(works))

    def _receive(self, works: list[tuple[Transfer, Any]]) -> None:
        timeout = datetime.timedelta(seconds=self.w.spec.recv_timeout_s)
        for t, work in works:
            try:
                work.wait(timeout)
            except Exception as e:  # noqa: BLE001 - the transport's error text is the diagnosis
                with self.w.wake:
                    self.errors.append(f"receive of {t.value} from worker {t.src} failed: "
                                       f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
                    self.w.wake.notify_all()
                return
            with self.w.wake:
                self.done.add(t.index)
                self.w.wake.notify_all()

    def _arrived(self, t: Transfer) -> bool:
        if t.index not in self.pending:
            return True
        if self.errors:
            raise RuntimeError(self.errors[0])
        if t.index not in self.done:
            return False
        self.store[t.value] = self.w.landed(t, self.pending.pop(t.index), self.inputs)
        return True

    def advance(self, limit: int | None = None) -> bool:
        """Run the next nodes whose data is there (at most ``limit``); whether any ran."""
        w, r = self.w, self.w.route
        start = self.cursor
        while self.cursor < len(w.nodes) and (limit is None or self.cursor - start < limit):
            p = self.cursor
            if not all([self._arrived(t) for t in r.recvs[p]]):
                break
            node = w.nodes[p]
            t0 = time.perf_counter()
            self.store[node.name] = w.call(node, self.inputs, self.store)
            dt = time.perf_counter() - t0
            self.busy_s += dt
            self.duty.computed(dt)
            if r.sends[p]:
                self.duty.pay()
                for t in r.sends[p]:
                    data = w.outgoing(self.store[t.value])
                    self.sent.append((dist.isend(data, dst=t.dst, tag=tag(self.step_id, t, False)), data))
            for v in r.drops[p]:
                self.store.pop(v, None)
            self.cursor += 1
        if self.finished:
            self.duty.pay()
        return self.cursor > start

    @property
    def finished(self) -> bool:
        return self.cursor == len(self.w.nodes)

    def ready(self) -> bool:
        """Whether ``advance`` could run something now (call under ``w.wake``)."""
        if self.errors:
            return True
        need = self.w.route.recvs[self.cursor] if not self.finished else ()
        return all(t.index in self.done or t.index not in self.pending for t in need)

    def result(self) -> dict[str, Any]:
        logits = self.store.get(self.w.route.output) if self.w.route.has_output else None
        return dict(step_id=self.step_id, logits=None if logits is None else to_wire(logits),
                    start_s=self.start_s, end_s=time.perf_counter(), busy_s=self.busy_s,
                    idle_s=self.duty.paid_s, cpu_s=time.process_time())


def serve_iterations(w: Worker, ahead: queue.SimpleQueue, results: Any) -> None:
    """The gloo worker's loop: every iteration it was sent runs at once, each node as soon as its data is
    there; finished ones report to the driver (the previous one's sends waited for then, not its own:
    a send completes only once the peer has posted that iteration's receives, as in the runtime). Ends at
    the driver's None."""
    active: list[WorkerIteration] = []
    stopping = False
    while True:
        while not stopping:
            try:
                cmd, posted = ahead.get(block=not active)
            except queue.Empty:
                break
            if isinstance(posted, Exception):
                raise posted
            if cmd is None:
                stopping = True
            elif isinstance(cmd, ProfileCmd):
                results.put(("done", w.rank, profile_nodes(w, cmd)))
            else:
                lanes = {a.lane for a in active}
                lane = next(i for i in range(len(active) + 1) if i not in lanes)
                active.append(WorkerIteration(w, cmd, posted, lane))
        if stopping and not active:
            w.flush_sends()
            return
        progressed = False
        for a in list(active):  # oldest first, one node at a time: a node of the oldest iteration that can
            # run goes before any younger one's, so an arrival for an older group waits one node, not a
            # younger group's whole stretch (the latency through a placement that crosses often)
            if a.advance(limit=1):
                progressed = True
            if a.finished:
                w.flush_sends()
                w.unsent = a.sent
                results.put(("done", w.rank, a.result()))
                active.remove(a)
                progressed = True
            if progressed:
                break
        if not progressed and active:
            _wait(w, active, more=lambda: not ahead.empty())


def _wait(w: Worker, active: list[WorkerIteration], more: Callable[[], bool]) -> None:
    with w.wake:
        ok = w.wake.wait_for(lambda: more() or any(a.ready() for a in active), timeout=w.spec.recv_timeout_s)
    for a in active:
        if a.errors:
            raise RuntimeError(a.errors[0])
    if not ok:
        blocked = next(a for a in active if not a.finished)
        t = w.route.recvs[blocked.cursor][0]
        raise TimeoutError(f"worker {w.rank}: receive of {t.value} from worker {t.src} timed out after "
                           f"{w.spec.recv_timeout_s:g} s")


def run_ordered(w: Worker, cmd: IterCmd) -> dict[str, Any]:
    """One iteration in the global issue order (NCCL; on gloo every message on tag 0): a receive is posted
    at its key and waited for right before its consumer (on NCCL the wait makes the compute stream wait,
    not the host); a decode iteration's stretches of capturable nodes run as CUDA graphs."""
    start = time.perf_counter()
    inputs, store, duty = w.inputs_of(cmd), {}, Duty(w.spec.speed)
    posted: dict[int, tuple[Tensor, Any]] = {}
    sent: list[tuple[Any, Tensor]] = []
    timeout = datetime.timedelta(seconds=w.spec.recv_timeout_s)
    decode = inputs["input_ids"].shape[0] == inputs["seq_lens"].shape[0]
    busy = 0.0
    segment: list[int] = []

    def flush() -> None:
        nonlocal busy
        t0 = time.perf_counter()
        _run_segment(w, segment, inputs, store, decode)
        busy += time.perf_counter() - t0
        duty.computed(time.perf_counter() - t0)
        segment.clear()

    for act in w.actions:
        if act.kind == "run":
            for t in w.route.recvs[act.position]:
                if segment:
                    flush()
                buf, work = posted.pop(t.index)
                work.wait(timeout)
                store[t.value] = w.landed(t, buf, inputs)
            segment.append(act.position)
            continue
        if segment:
            flush()
        t = act.transfer
        if act.kind == "recv":
            buf = w.buffer(t, inputs)
            posted[t.index] = (buf, dist.irecv(buf, src=t.src, tag=tag(cmd.step_id, t, True)))
        else:
            duty.pay()
            data = w.outgoing(store[t.value])
            sent.append((dist.isend(data, dst=t.dst, tag=tag(cmd.step_id, t, True)), data))
    if segment:
        flush()
    duty.pay()
    synchronize(w.device)
    w.flush_sends()
    w.unsent = sent
    logits = store.get(w.route.output) if w.route.has_output else None
    return dict(step_id=cmd.step_id, logits=None if logits is None else to_wire(logits), start_s=start,
                end_s=time.perf_counter(), busy_s=busy, idle_s=duty.paid_s, cpu_s=time.process_time())


def _run_segment(w: Worker, positions: list[int], inputs: dict[str, Tensor], store: dict[str, Tensor],
                 decode: bool) -> None:
    """Run the nodes at ``positions`` (no transfer between them): as CUDA graphs where they may be."""
    stretch: list[int] = []

    def replay() -> None:
        nodes = [w.nodes[p] for p in stretch]
        key = (stretch[0], len(stretch), inputs["input_ids"].shape[0], inputs["logits_indices"].shape[0],
               inputs["block_table"].shape[1])
        store.update(w.graphs.run(key, nodes, lambda a: w.fetch(a, inputs, store)))
        stretch.clear()

    for p in positions:
        node = w.nodes[p]
        if w.graphs is not None and decode and capturable(w.program, node):
            stretch.append(p)
            continue
        if stretch:
            replay()
        store[node.name] = w.call(node, inputs, store)
    if stretch:
        replay()
    for p in positions:
        for v in w.route.drops[p]:
            if v not in (t.value for t in w.route.sends[p]):
                store.pop(v, None)


def profile_nodes(w: Worker, cmd: ProfileCmd) -> dict[str, Any]:
    """Median seconds of each of this worker's nodes on ``cmd``'s inputs. A duty-cycled worker idles once
    at the end of each run, as it does before handing an iteration's value on; each node is charged its
    share of that run's wall time by its share of the compute."""
    inputs = w.inputs_of(cmd)
    times: list[list[float]] = [[] for _ in w.nodes]
    duty = Duty(w.spec.speed)
    t_start = time.perf_counter()
    r = 0
    while r <= cmd.repeats or time.perf_counter() - t_start < cmd.min_s:
        store: dict[str, Tensor] = {}
        t_run = time.perf_counter()
        dts = []
        for node in w.nodes:
            t0 = time.perf_counter()
            store[node.name] = w.call(node, inputs, store)
            synchronize(w.device)
            dts.append(time.perf_counter() - t0)
        duty.computed(sum(dts))
        duty.pay()
        scale = (time.perf_counter() - t_run) / max(sum(dts), 1e-12)
        if r:
            for p, dt in enumerate(dts):
                times[p].append(dt * scale)
        r += 1
    med = [sorted(ts)[len(ts) // 2] for ts in times]
    return dict(step_id=cmd.step_id, node_s={n.name: t for n, t in zip(w.nodes, med, strict=True)})


def _node_names(spec: WorkerSpec) -> list[str]:
    """The program's node names, in order (every process traces the same program)."""
    return list(spec.layouts)


def worker_main(rank: int, commands: Any, results: Any, heartbeat: Any, parent: int) -> None:
    def body(spec: WorkerSpec) -> None:
        join_group(spec)
        w = Worker(spec)
        link = probe_link(spec.rank, spec.world, w.link, w.waiters) if spec.world > 1 else None
        results.put(("ready", spec.rank, {"resident_bytes": w.share.resident_bytes,
                                          "loaded_bytes": w.share.loaded_bytes, "link": link}))
        ahead = read_ahead(w, commands)
        if spec.ordered:
            while True:
                cmd, posted = ahead.get()
                if isinstance(posted, Exception):
                    raise posted
                if cmd is None:
                    break
                out = profile_nodes(w, cmd) if isinstance(cmd, ProfileCmd) else run_ordered(w, cmd)
                results.put(("done", spec.rank, out))
            w.flush_sends()
        else:
            serve_iterations(w, ahead, results)
        dist.destroy_process_group()

    worker_process(rank, commands, results, heartbeat, parent, body)
