"""One worker process per device: holds its partition's resident buffers and runs its kernels.

Data plane: torch.distributed point-to-point, env:// rendezvous: gloo (host tensors; a CUDA worker stages
through host memory) with every receive posted up front (step_threaded.py), or NCCL (device tensors) in
one global issue order (step_ordered.py). Control plane: a command queue from the driver and a result
queue back; a heartbeat slot the driver watches. Everything the worker holds lives on its one device
(``torch_device(spec.device)``); step inputs and outputs cross the queues as host bytes.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from tessera.graph import Buffer, Role
from tessera.runtime.compiled import CompiledOp, bind_weights, compile_program
from tessera.runtime.device import (
    HOST,
    Clock,
    as_bytes,
    empty_bytes,
    fresh_storage,
    on_device,
    set_up,
    torch_device,
)
from tessera.runtime.partition import STEP_START, BufferTransfer, Partition
from tessera.runtime.probe import probe_link
from tessera.runtime.program import CapturedProgram, Storages, Wire, from_wire, to_wire, view_of
from tessera.runtime.state import carry, load_weights
from tessera.runtime.step_ordered import Action, ordered_actions, run_ordered
from tessera.runtime.step_threaded import (
    Posted,
    ThreadedStep,
    Waiters,
    finish_sends,
    post_receives,
    run_threaded,
    wait_for,
)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters (malloc.h)
GIL_SWITCH_S = 2e-4


@dataclass(frozen=True, kw_only=True)
class PartitionWorkerSpec:
    """What a worker process running its share of each partition of captured programs is handed (the
    engine's ``WorkerSpec`` hands its workers a share of the traced model instead)."""

    rank: int
    world: int
    device: str  # "cpu" or "cuda:N": where everything this worker holds and computes lives
    backend: str  # gloo | nccl
    ordered: bool  # issue in the one global order NCCL needs (step_ordered.py), not receives up front
    threads: int
    recv_timeout_s: float
    programs: dict[str, CapturedProgram] = field(hash=False)  # step key -> program stripped to this device's share
    partitions: dict[tuple[str, str], Partition] = field(hash=False)  # (step key, plan name) -> partition
    weights: dict[str, torch.Tensor] = field(hash=False)  # name -> uint8 bytes, only this device's
    weights_dir: str | None = None  # load weights from safetensors here instead (only the needed names)
    max_microbatches: int = 1


@dataclass(frozen=True, kw_only=True)
class StepCmd:
    step_id: int
    key: str  # which program
    plan: str
    inputs: tuple[dict[int, Wire], ...]  # per micro-batch: input buffer -> its bytes
    reset: bool  # start the micro-batches' KV/state from the program's initial contents (new requests)
    # serving (continuous batching): per micro-batch its own program, KV/state slot and reset; empty = key,
    # micro-batch index and ``reset`` for every micro-batch (the round-based runs)
    keys: tuple[str, ...] = ()
    slots: tuple[int, ...] = ()
    resets: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        m = len(self.inputs)
        for what, v in (("keys", self.keys), ("slots", self.slots), ("resets", self.resets)):
            if v and len(v) != m:
                raise ValueError(f"StepCmd.{what} has {len(v)} entries for {m} micro-batches")

    def key_of(self, mb: int) -> str:
        return self.keys[mb] if self.keys else self.key

    def slot_of(self, mb: int) -> int:
        return self.slots[mb] if self.slots else mb

    def reset_of(self, mb: int) -> bool:
        return self.resets[mb] if self.resets else self.reset

    def slot_set(self) -> set[int]:
        """The KV/state slots this step reads and writes."""
        return {self.slot_of(mb) for mb in range(len(self.inputs))}


@dataclass(frozen=True, kw_only=True)
class LocalPlan:
    """One partition as this worker runs it; entry i of recvs/sends belongs to ops[i]."""

    ops: tuple[CompiledOp, ...]
    recvs: tuple[tuple[BufferTransfer, ...], ...]  # awaited before ops[i]
    sends: tuple[tuple[BufferTransfer, ...], ...]  # posted after ops[i]
    start_sends: tuple[BufferTransfer, ...]
    end_recvs: tuple[BufferTransfer, ...]  # end-of-step KV/state syncs
    order: tuple[BufferTransfer, ...]  # every receive, in the order this worker needs them
    actions: tuple[Action, ...]  # the ordered schedule (empty unless PartitionWorkerSpec.ordered)


class PartitionWorker:
    """A worker process's state: its share of every partition, compiled, and the transfers in flight."""

    def __init__(self, spec: PartitionWorkerSpec, results: Any) -> None:
        self.spec, self.results, self.rank = spec, results, spec.rank
        self.device = torch_device(spec.device)
        self.link = self.device if spec.backend == "nccl" else HOST  # where transfer tensors live
        self.clock = Clock(self.device)
        self.weights: dict[str, torch.UntypedStorage] = self._load_weights()
        self.state: list[dict[str, torch.UntypedStorage]] = [{} for _ in range(spec.max_microbatches)]
        # per micro-batch: name -> the Buffer its storage was last shaped as (for carrying)
        self.state_buf: list[dict[str, Buffer]] = [{} for _ in range(spec.max_microbatches)]
        self.local = {pk: self._compile(pk) for pk in spec.partitions}
        self.unsent: list[tuple[Any, torch.Tensor]] = []  # the last finished gloo step's sends (finish_sends)
        self.waiters = Waiters()  # the gloo path's receive threads
        self.wake = threading.Condition()  # notified by every arrival and every command taken (gloo path)

    def _compile(self, pk: tuple[str, str]) -> LocalPlan:
        """This worker's share of one partition as flat lists indexed by position in its kernel order."""
        prog, part, me = self.spec.programs[pk[0]], self.spec.partitions[pk], self.rank
        weights = {b: self.weights[prog.name(b)] for b in part.resident[me] if prog.role(b) is Role.WEIGHT}
        ops = bind_weights(compile_program(prog, part.kernels[me], self.device), weights)
        sends, recvs = part.sends_after(me), part.recvs_before(me)
        return LocalPlan(ops=tuple(ops), recvs=tuple(tuple(recvs.get(c.kernel, ())) for c in ops),
                         sends=tuple(tuple(sends.get(c.kernel, ())) for c in ops),
                         start_sends=tuple(sends.get(STEP_START, ())), end_recvs=tuple(recvs.get(len(prog.ops), ())),
                         order=tuple(sorted((t for ts in recvs.values() for t in ts), key=lambda t: (t.before, t.index))),
                         actions=ordered_actions(part, me, len(prog.ops)) if self.spec.ordered else ())

    def _needed_weights(self) -> dict[str, Buffer]:
        out: dict[str, Buffer] = {}
        for (key, _), part in self.spec.partitions.items():
            prog = self.spec.programs[key]
            out |= {prog.name(b): prog.graph.buffers[b] for b in part.resident[self.rank]
                    if prog.role(b) is Role.WEIGHT}
        return out

    def _load_weights(self) -> dict[str, torch.UntypedStorage]:
        names = self._needed_weights()
        if self.spec.weights_dir is not None:
            got = load_weights(self.spec.weights_dir, names, self.device)
        else:
            got = {n: on_device(t, self.device).untyped_storage() for n, t in self.spec.weights.items()}
        assert set(got) == set(names), f"worker {self.rank}: weights {sorted(set(got) ^ set(names))} misplaced"
        return got

    def flush_sends(self) -> None:
        for work, _ in self.unsent:
            work.wait(datetime.timedelta(seconds=self.spec.recv_timeout_s))
        self.unsent = []

    def resident_report(self) -> dict[str, int]:
        return {n: s.nbytes() for n, s in self.weights.items()}

    # ---- one step --------------------------------------------------------------------------

    def _store(self, prog: CapturedProgram, part: Partition, mb: int, cmd: StepCmd) -> Storages:
        store: Storages = {}
        dev = self.device
        slot, reset = cmd.slot_of(mb), cmd.reset_of(mb)
        for b in part.resident[self.rank]:
            buf = prog.graph.buffers[b]
            if buf.role is Role.WEIGHT:
                store[b] = self.weights[buf.name]
                continue
            st = self.state[slot]
            if reset or buf.name not in st:
                st[buf.name] = fresh_storage(prog.initial[b], dev)
            elif self.state_buf[slot][buf.name].shape != buf.shape:
                st[buf.name] = carry(st[buf.name], self.state_buf[slot][buf.name], buf)
            self.state_buf[slot][buf.name] = buf
            store[b] = st[buf.name]
        for b in part.inputs[self.rank]:
            given = cmd.inputs[mb].get(b)
            store[b] = on_device(from_wire(given) if given is not None else prog.initial[b], dev).untyped_storage()
        return store

    def outgoing(self, st: torch.UntypedStorage, snapshot: bool) -> torch.Tensor:
        """What a send hands the transport: the bytes on the link's device (a host copy when a CUDA worker
        stages through gloo, which is a snapshot by itself); otherwise copied only if mutated later."""
        data = as_bytes(st)
        if self.link != self.device:
            return data.to(self.link)
        return data.clone() if snapshot else data

    def recv_buffer(self, nbytes: int) -> torch.Tensor:
        return empty_bytes(nbytes, self.link)

    def landed(self, buf: torch.Tensor) -> torch.UntypedStorage:
        return on_device(buf, self.device).untyped_storage()

    def post(self, cmd: StepCmd) -> Posted | None:
        """Post a step's receives ahead of running it (gloo); None on the ordered (NCCL) schedule, which
        must issue every receive in its one global order."""
        return None if self.spec.ordered else post_receives(self, self._local_plans(cmd), cmd.step_id)

    def _local_plans(self, cmd: StepCmd) -> list[LocalPlan]:
        return [self.local[(cmd.key_of(mb), cmd.plan)] for mb in range(len(cmd.inputs))]

    def run_step(self, cmd: StepCmd, posted: Posted | None = None) -> dict[str, Any]:
        """One step, the worker's only one in flight; ``posted``: its receives, from ``post`` (else posted
        now)."""
        start = self.clock.begin()
        stores = self._stores(cmd)
        t_stored = time.perf_counter()
        if self.spec.ordered:
            lps = self._local_plans(cmd)
            if len({id(lp) for lp in lps}) > 1:
                raise ValueError("the ordered (NCCL) schedule runs one program per step; mixed steps need gloo")
            ev = run_ordered(self, lps[0].ops, lps[0].actions, stores)
        else:
            ev = run_threaded(self, self._local_plans(cmd), stores, cmd.step_id, posted)
        return self._result(cmd, stores, ev, start, t_stored)

    def begin_step(self, cmd: StepCmd, posted: Posted | None, lane: int, idle: bool) -> Active:
        """Start a step beside the others in flight (gloo; see serve_commands): its storages set up, its
        start sends posted. ``idle``: no other step in flight (the device clock's origin is taken then)."""
        start = self.clock.begin() if idle else time.perf_counter()
        anchor = self.clock.anchor()
        stores = self._stores(cmd)
        t_stored = time.perf_counter()
        step = ThreadedStep(self, self._local_plans(cmd), stores, cmd.step_id, posted, lane=lane)
        return Active(cmd=cmd, step=step, stores=stores, start_s=start, stored_s=t_stored, lane=lane,
                      anchor=anchor)

    def end_step(self, a: Active) -> dict[str, Any]:
        finish_sends(self, a.step)
        return self._result(a.cmd, a.stores, a.step.events(), a.start_s, a.stored_s, a.anchor)

    def _stores(self, cmd: StepCmd) -> list[Storages]:
        return [self._store(self.spec.programs[cmd.key_of(mb)], self.spec.partitions[(cmd.key_of(mb), cmd.plan)],
                            mb, cmd) for mb in range(len(cmd.inputs))]

    def _result(self, cmd: StepCmd, stores: list[Storages], ev: dict[str, list], start_s: float,
                stored_s: float, anchor: Any = None) -> dict[str, Any]:
        """The step's outputs and events; its KV/state written back to its slots."""
        m, me = len(cmd.inputs), self.rank
        progs = [self.spec.programs[cmd.key_of(mb)] for mb in range(m)]
        parts = [self.spec.partitions[(cmd.key_of(mb), cmd.plan)] for mb in range(m)]
        self.clock.finish()
        if self.clock.cuda:  # event tokens -> seconds on the host timeline; the times end each tuple
            n_times = {"kernels": 2, "waits": 2, "sends": 1, "recvs": 1}
            sec = lambda t: self.clock.seconds(t, anchor)  # noqa: E731
            ev = {k: [(*e[:-n_times[k]], *map(sec, e[-n_times[k]:])) for e in v] for k, v in ev.items()}
        for mb in range(m):  # state written back by name (an end-of-step sync may have replaced it)
            for b in parts[mb].resident[me]:
                if progs[mb].role(b) is not Role.WEIGHT:
                    self.state[cmd.slot_of(mb)][progs[mb].name(b)] = stores[mb][b]
        outputs = {(mb, i): to_wire(view_of(stores[mb], r)) for mb in range(m)
                   for i, r in enumerate(progs[mb].outputs) if parts[mb].output_device[i] == me}
        # stored_s: storages set up, first kernel next; cpu_s: this process's CPU seconds so far (all threads)
        return dict(step_id=cmd.step_id, outputs=outputs, **ev, start_s=start_s, stored_s=stored_s,
                    end_s=time.perf_counter(), cpu_s=time.process_time())


@dataclass
class Active:
    """A step in flight on a worker that runs several at once."""

    cmd: StepCmd
    step: ThreadedStep
    stores: list[Storages]
    start_s: float
    stored_s: float
    lane: int
    anchor: Any = None  # the device clock's point for this step's kernel events (CUDA)


def serve_commands(worker: PartitionWorker, ahead: queue.SimpleQueue, results: Any) -> None:
    """The gloo worker's loop: every queued step runs at once, oldest first, each kernel as soon as its data
    is there, so while one serving group's step waits on a transfer the worker computes another group's
    (the asynchronous schedule: a group waits only for its own previous iteration). A step whose KV/state
    slots a step in flight still holds waits for it (a round's steps all use slots 0..m-1). Ends at the
    driver's None, after the steps before it."""
    active: list[Active] = []
    queued: list[tuple[StepCmd, Posted | None]] = []
    stopping = False
    while True:
        while not stopping:
            try:
                cmd, posted = ahead.get(block=not active and not queued)
            except queue.Empty:
                break
            if isinstance(posted, Exception):
                raise posted
            if cmd is None:
                stopping = True
            else:
                queued.append((cmd, posted))
        while queued:  # start what is free to start, in order
            cmd, posted = queued[0]
            if cmd.slot_set() & set().union(*(a.cmd.slot_set() for a in active)):
                break
            queued.pop(0)
            lanes = {a.lane for a in active}
            lane = next(i for i in range(len(active) + 1) if i not in lanes)
            active.append(worker.begin_step(cmd, posted, lane, idle=not active))
        if stopping and not active:
            worker.flush_sends()
            return
        progressed = False
        for a in list(active):
            progressed |= a.step.advance()
            if a.step.finished:
                results.put(("done", worker.rank, worker.end_step(a)))
                active.remove(a)
                progressed = True
        if not progressed and active:
            wait_for(worker, [a.step for a in active], more=lambda: not ahead.empty())


def _watch(heartbeat: Any, rank: int, parent: int) -> None:
    """Beat every 0.1 s; exit at once if the driver is gone (no orphans)."""
    while True:
        heartbeat[rank] = time.monotonic()
        if os.getppid() != parent:
            os._exit(3)
        time.sleep(0.1)


def keep_freed_memory() -> None:
    """Stop glibc handing freed step memory back to the OS: a worker frees a whole step's activations at
    once, the heap top is trimmed, and the next step page-faults it all back (measured: 1 MB elementwise
    kernels 4x slower than in one process). Fixed thresholds keep it in the heap, as a busy process does."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return
    libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)  # the largest value glibc accepts on 64-bit
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)


def join_group(spec: PartitionWorkerSpec) -> datetime.timedelta:
    """A worker process's set-up and its process group (env:// rendezvous), whoever started the process
    (Cluster's spawn or torchrun); returns the timeout the group's collectives run under."""
    keep_freed_memory()
    # A receive thread that has its data must get the GIL back from the compute loop quickly; at the
    # default 5 ms switch interval a handoff cost up to a whole interval (seen as 1-5 ms waits in traces).
    sys.setswitchinterval(GIL_SWITCH_S)
    torch.set_num_threads(spec.threads)
    device = torch_device(spec.device)
    set_up(device)  # before the process group: NCCL binds to the current device
    timeout = datetime.timedelta(seconds=max(30.0, spec.recv_timeout_s))
    dist.init_process_group(spec.backend, init_method="env://", rank=spec.rank, world_size=spec.world,
                            timeout=timeout, device_id=device if spec.backend == "nccl" else None)
    return timeout


def read_ahead(worker: PartitionWorker, commands: Any) -> queue.SimpleQueue:
    """A thread that takes each command off the driver's queue as it arrives and posts its receives at
    once, while the worker may still compute an earlier step; returns the queue of (command, its Posted
    or the exception posting raised), ending with (None, None)."""
    ahead: queue.SimpleQueue = queue.SimpleQueue()

    def hand_over(item: tuple[Any, Any]) -> None:
        ahead.put(item)
        with worker.wake:  # a worker blocked on its steps' transfers may start this one (or stop)
            worker.wake.notify_all()

    def read() -> None:
        try:
            while True:
                cmd = commands.get()
                if cmd is None:
                    hand_over((None, None))
                    return
                hand_over((cmd, worker.post(cmd)))
        except BaseException as e:  # noqa: BLE001 - re-raised by the worker's main loop, which reports it
            hand_over((None, e if isinstance(e, Exception) else RuntimeError(f"command reader: {e!r}")))

    threading.Thread(target=read, daemon=True, name="tessera-commands").start()
    return ahead


def worker_process(rank: int, commands: Any, results: Any, heartbeat: Any, parent: int,
                   body: Callable[[Any], None]) -> None:
    """A spawned worker's life (Processes.spawn): beat, take the spec off the command queue, run
    ``body(spec)``; an exception is reported to the driver, which names this worker and stops the
    others, and the process exits at once. SIGINT is ignored (Ctrl-C is the driver's to handle: it stops
    the workers), should the spawner not have done so already."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch, args=(heartbeat, rank, parent), daemon=True).start()
    try:
        body(commands.get())
    except Exception as e:  # reported to the driver, which names this worker and stops the others
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        results.put(("error", rank, f"{type(e).__name__}: {msg}", traceback.format_exc()))
        if os.environ.get("TESSERA_DEBUG"):
            traceback.print_exc()
        results.close()
        results.join_thread()  # flush the report before exiting without cleanup
        os._exit(1)


def worker_main(rank: int, commands: Any, results: Any, heartbeat: Any, parent: int) -> None:
    def body(spec: PartitionWorkerSpec) -> None:
        join_group(spec)
        worker = PartitionWorker(spec, results)
        link = probe_link(spec.rank, spec.world, worker.link, worker.waiters)
        results.put(("ready", spec.rank, {"weights": worker.resident_report(), "link": link}))
        ahead = read_ahead(worker, commands)
        if spec.ordered:  # NCCL: one step at a time, every worker in one global issue order
            while True:
                cmd, posted = ahead.get()
                if isinstance(posted, Exception):
                    raise posted
                if cmd is None:
                    break
                results.put(("done", spec.rank, worker.run_step(cmd, posted)))
        else:
            serve_commands(worker, ahead, results)
        dist.destroy_process_group()

    worker_process(rank, commands, results, heartbeat, parent, body)
