"""One worker process per device: holds its partition's resident buffers and runs its kernels.

Data plane: torch.distributed point-to-point (gloo on CPU, NCCL on CUDA), env:// rendezvous, so
torchrun's environment works unchanged. Control plane: a command queue from the driver and a result
queue back; a heartbeat slot the driver watches. Micro-batches are interleaved: every receive of the
step is posted up front, then each micro-batch runs until its next kernel waits on a transfer that
has not arrived, so one micro-batch computes while another's activations travel.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from tessera.graph import Buffer, Role
from tessera.runtime.compiled import CompiledOp, bind_weights, call, compile_program
from tessera.runtime.partition import STEP_START, Partition, Transfer
from tessera.runtime.probe import probe_link
from tessera.runtime.program import Program, Storages, Wire, as_bytes, from_wire, to_wire, view_of
from tessera.runtime.state import carry, load_weights

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters (malloc.h)
GIL_SWITCH_S = 2e-4


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    rank: int
    world: int
    device: str  # "cpu" or "cuda:N"
    backend: str  # gloo | nccl
    threads: int
    recv_timeout_s: float
    programs: dict[str, Program] = field(hash=False)  # step key -> program stripped to this device's share
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


@dataclass(frozen=True, kw_only=True)
class LocalPlan:
    """One partition as this worker runs it; entry i of recvs/sends belongs to ops[i]."""

    ops: tuple[CompiledOp, ...]
    recvs: tuple[tuple[Transfer, ...], ...]  # awaited before ops[i]
    sends: tuple[tuple[Transfer, ...], ...]  # posted after ops[i]
    start_sends: tuple[Transfer, ...]
    end_recvs: tuple[Transfer, ...]  # end-of-step KV/state syncs
    order: tuple[Transfer, ...]  # every receive, in the order this worker needs them


def _tag(step_id: int, t: Transfer, mb: int) -> int:
    assert t.index < 1 << 16 and mb < 1 << 6, "transfer index / micro-batch exceed the tag layout"
    return ((step_id % 256) << 22) | (t.index << 6) | mb


class Worker:
    def __init__(self, spec: WorkerSpec, results: Any) -> None:
        self.spec, self.results, self.rank = spec, results, spec.rank
        self.weights: dict[str, torch.UntypedStorage] = self._load_weights()
        self.state: list[dict[str, torch.UntypedStorage]] = [{} for _ in range(spec.max_microbatches)]
        # per micro-batch: name -> the Buffer its storage was last shaped as (for carrying)
        self.state_buf: list[dict[str, Buffer]] = [{} for _ in range(spec.max_microbatches)]
        self.local = {pk: self._compile(pk) for pk in spec.partitions}

    def _compile(self, pk: tuple[str, str]) -> LocalPlan:
        """This worker's share of one partition as flat lists indexed by position in its kernel order."""
        prog, part, me = self.spec.programs[pk[0]], self.spec.partitions[pk], self.rank
        weights = {b: self.weights[prog.name(b)] for b in part.resident[me] if prog.role(b) is Role.WEIGHT}
        ops = bind_weights(compile_program(prog, part.kernels[me]), weights)
        sends, recvs = part.sends_after(me), part.recvs_before(me)
        return LocalPlan(ops=tuple(ops), recvs=tuple(tuple(recvs.get(c.kernel, ())) for c in ops),
                         sends=tuple(tuple(sends.get(c.kernel, ())) for c in ops),
                         start_sends=tuple(sends.get(STEP_START, ())), end_recvs=tuple(recvs.get(len(prog.ops), ())),
                         order=tuple(sorted((t for ts in recvs.values() for t in ts), key=lambda t: (t.before, t.index))))

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
            got = load_weights(self.spec.weights_dir, names)
        else:
            got = {n: t.untyped_storage() for n, t in self.spec.weights.items()}
        assert set(got) == set(names), f"worker {self.rank}: weights {sorted(set(got) ^ set(names))} misplaced"
        return got

    def resident_report(self) -> dict[str, int]:
        return {n: s.nbytes() for n, s in self.weights.items()}

    # ---- one step --------------------------------------------------------------------------

    def _store(self, prog: Program, part: Partition, mb: int, cmd: StepCmd) -> Storages:
        store: Storages = {}
        for b in part.resident[self.rank]:
            buf = prog.graph.buffers[b]
            if buf.role is Role.WEIGHT:
                store[b] = self.weights[buf.name]
                continue
            st = self.state[mb]
            if cmd.reset or buf.name not in st:
                st[buf.name] = prog.initial[b].untyped_storage().clone()
            elif self.state_buf[mb][buf.name].shape != buf.shape:
                st[buf.name] = carry(st[buf.name], self.state_buf[mb][buf.name], buf)
            self.state_buf[mb][buf.name] = buf
            store[b] = st[buf.name]
        for b in part.inputs[self.rank]:
            given = cmd.inputs[mb].get(b)
            store[b] = (from_wire(given) if given is not None else prog.initial[b]).untyped_storage()
        return store

    def run_step(self, cmd: StepCmd) -> dict[str, Any]:
        prog, part = self.spec.programs[cmd.key], self.spec.partitions[(cmd.key, cmd.plan)]
        lp = self.local[(cmd.key, cmd.plan)]
        m, me = len(cmd.inputs), self.rank
        t_start = time.perf_counter()
        stores = [self._store(prog, part, mb, cmd) for mb in range(m)]
        # gloo's point-to-point Work never reports completion to is_completed() before wait(), so one
        # thread per micro-batch waits on its receives in the order that micro-batch needs them.
        pending: dict[tuple[int, int], torch.Tensor] = {}
        done: dict[tuple[int, int], float] = {}
        errors: list[str] = []
        cond = threading.Condition()
        timeout = datetime.timedelta(seconds=self.spec.recv_timeout_s)

        def receive(works: list[tuple[Transfer, int, Any]]) -> None:
            for t, mb, work in works:
                try:
                    work.wait(timeout)
                except Exception as e:  # noqa: BLE001 - the transport's error text is the diagnosis
                    with cond:
                        errors.append(f"receive of buffer {t.buffer} from worker {t.src} failed: "
                                      f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
                        cond.notify_all()
                    return
                with cond:
                    done[(t.index, mb)] = time.perf_counter()
                    cond.notify_all()

        threads = []
        for mb in range(m):
            works = []
            for t in lp.order:
                buf = torch.empty(t.nbytes, dtype=torch.uint8)
                pending[(t.index, mb)] = buf
                works.append((t, mb, dist.irecv(buf, src=t.src, tag=_tag(cmd.step_id, t, mb))))
            if works:
                threads.append(threading.Thread(target=receive, args=(works,), daemon=True))
                threads[-1].start()
        sent: list[Any] = []
        ev_kernels: list[tuple[int, int, float, float]] = []
        ev_sends: list[tuple[int, int, float]] = []
        ev_recvs: list[tuple[int, int, float]] = []  # (transfer, mb, arrival noticed at)
        ev_waits: list[tuple[float, float]] = []  # intervals with every micro-batch blocked on a transfer

        def post_sends(ts: tuple[Transfer, ...], mb: int) -> None:
            for t in ts:
                st = stores[mb][t.buffer]
                data = as_bytes(st).clone() if t.snapshot else as_bytes(st)  # copy only if mutated later
                ev_sends.append((t.index, mb, time.perf_counter()))
                sent.append((dist.isend(data, dst=t.dst, tag=_tag(cmd.step_id, t, mb)), data))

        def arrived(t: Transfer, mb: int) -> bool:
            key = (t.index, mb)
            if key not in pending:
                return True
            if errors:
                raise RuntimeError(errors[0])
            if key not in done:
                return False
            stores[mb][t.buffer] = pending.pop(key).untyped_storage()
            ev_recvs.append((t.index, mb, done[key]))
            return True

        def wait_until(keys: list[tuple[int, int]], what: str) -> None:
            t0 = time.perf_counter()
            with cond:
                ok = cond.wait_for(lambda: bool(errors) or any(k in done for k in keys),
                                   timeout=self.spec.recv_timeout_s)
            ev_waits.append((t0, time.perf_counter()))
            if errors:
                raise RuntimeError(errors[0])
            if not ok:
                raise TimeoutError(f"worker {me}: {what} timed out after {self.spec.recv_timeout_s:g} s")

        for mb in range(m):
            post_sends(lp.start_sends, mb)
        ops, need, after, n_ops = lp.ops, lp.recvs, lp.sends, len(lp.ops)
        clock, record = time.perf_counter, ev_kernels.append
        cursor = [0] * m
        while any(c < n_ops for c in cursor):
            progressed = False
            for mb in range(m):
                store, i = stores[mb], cursor[mb]
                while i < n_ops:
                    if need[i] and not all([arrived(t, mb) for t in need[i]]):
                        break
                    c = ops[i]
                    t0 = clock()
                    call(store, c)
                    record((c.kernel, mb, t0, clock()))
                    if after[i]:
                        post_sends(after[i], mb)
                    i += 1
                progressed |= i > cursor[mb]
                cursor[mb] = i
            if not progressed:
                blocking = [(t.index, mb) for mb in range(m) if cursor[mb] < n_ops
                            for t in need[cursor[mb]] if (t.index, mb) in pending]
                assert blocking, "every micro-batch blocked but no receive pending"
                t = next(t for t in lp.order if t.index == blocking[0][0])
                wait_until(blocking, f"receive of buffer {t.buffer} from worker {t.src}")
        for mb in range(m):  # end-of-step state syncs
            for t in lp.end_recvs:
                while not arrived(t, mb):
                    wait_until([(t.index, mb)], f"receive of buffer {t.buffer} from worker {t.src}")
        for work, _ in sent:
            work.wait(timeout)
        for th in threads:
            th.join(timeout=self.spec.recv_timeout_s)
        for mb in range(m):  # state written back by name (an end-of-step sync may have replaced it)
            for b in part.resident[me]:
                if prog.role(b) is not Role.WEIGHT:
                    self.state[mb][prog.name(b)] = stores[mb][b]
        outputs = {(mb, i): to_wire(view_of(stores[mb], r)) for mb in range(m)
                   for i, r in enumerate(prog.outputs) if part.output_device[i] == me}
        return dict(step_id=cmd.step_id, outputs=outputs, kernels=ev_kernels, sends=ev_sends, recvs=ev_recvs,
                    waits=ev_waits, start_s=t_start, end_s=time.perf_counter())


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


def worker_main(spec: WorkerSpec, commands: Any, results: Any, heartbeat: Any, parent: int) -> None:
    keep_freed_memory()
    # A receive thread that has its data must get the GIL back from the compute loop quickly; at the
    # default 5 ms switch interval a handoff cost up to a whole interval (seen as 1-5 ms waits in traces).
    sys.setswitchinterval(GIL_SWITCH_S)
    threading.Thread(target=_watch, args=(heartbeat, spec.rank, parent), daemon=True).start()
    try:
        torch.set_num_threads(spec.threads)
        dist.init_process_group(spec.backend, init_method="env://", rank=spec.rank, world_size=spec.world,
                                timeout=datetime.timedelta(seconds=max(30.0, spec.recv_timeout_s)))
        worker = Worker(spec, results)
        link = probe_link(spec.rank, spec.world)
        results.put(("ready", spec.rank, {"weights": worker.resident_report(), "link": link}))
        while True:
            cmd = commands.get()
            if cmd is None:
                break
            results.put(("done", spec.rank, worker.run_step(cmd)))
        dist.destroy_process_group()
    except Exception as e:  # reported to the driver, which names this worker and stops the others
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        results.put(("error", spec.rank, f"{type(e).__name__}: {msg}", traceback.format_exc()))
        if os.environ.get("TESSERA_DEBUG"):
            traceback.print_exc()
        results.close()
        results.join_thread()  # flush the report before exiting without cleanup
        os._exit(1)
