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
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from tessera.graph import Buffer, Role
from tessera.runtime.partition import STEP_START, Partition, Transfer
from tessera.runtime.program import Program, Storages, as_bytes, run_op, view_of, zero_storage
from tessera.runtime.state import carry, load_weights


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters (malloc.h)


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
    inputs: tuple[dict[int, torch.Tensor], ...]  # per micro-batch: input buffer -> uint8 bytes
    reset: bool  # start the micro-batches' KV/state from the program's initial contents (new requests)


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
            store[b] = (given if given is not None else prog.initial[b]).untyped_storage()
        return store

    def run_step(self, cmd: StepCmd) -> dict[str, Any]:
        prog, part = self.spec.programs[cmd.key], self.spec.partitions[(cmd.key, cmd.plan)]
        m, me, n = len(cmd.inputs), self.rank, len(prog.ops)
        zeroed = prog.zeroed()
        t_start = time.perf_counter()
        stores = [self._store(prog, part, mb, cmd) for mb in range(m)]
        sends, recvs = part.sends_after(me), part.recvs_before(me)
        # gloo's point-to-point Work never reports completion to is_completed() before wait(), so one
        # thread per micro-batch waits on its receives in the order that micro-batch needs them.
        pending: dict[tuple[int, int], torch.Tensor] = {}
        done: dict[tuple[int, int], float] = {}
        errors: list[str] = []
        cond = threading.Condition()
        order = sorted((t for ts in recvs.values() for t in ts), key=lambda t: (t.before, t.index))
        timeout = datetime.timedelta(seconds=self.spec.recv_timeout_s)

        def receive(mb: int, works: list[tuple[Transfer, Any]]) -> None:
            for t, work in works:
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
            for t in order:
                buf = torch.empty(t.nbytes, dtype=torch.uint8)
                pending[(t.index, mb)] = buf
                works.append((t, dist.irecv(buf, src=t.src, tag=_tag(cmd.step_id, t, mb))))
            if works:
                threads.append(threading.Thread(target=receive, args=(mb, works), daemon=True))
                threads[-1].start()
        sent: list[Any] = []
        ev_kernels: list[tuple[int, int, float, float]] = []
        ev_sends: list[tuple[int, int, float]] = []
        ev_recvs: list[tuple[int, int, float]] = []  # (transfer, mb, arrival noticed at)
        ev_waits: list[tuple[float, float]] = []  # intervals with every micro-batch blocked on a transfer

        def post_sends(after: int, mb: int) -> None:
            for t in sends.get(after, ()):
                st = stores[mb][t.buffer]
                data = as_bytes(st).clone() if t.snapshot else as_bytes(st)
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
            post_sends(STEP_START, mb)
        mine = part.kernels[me]
        cursor = [0] * m
        while any(c < len(mine) for c in cursor):
            progressed = False
            for mb in range(m):
                while cursor[mb] < len(mine):
                    k = mine[cursor[mb]]
                    if not all([arrived(t, mb) for t in recvs.get(k, ())]):
                        break
                    store = stores[mb]
                    for b in prog.needs(k) & zeroed:
                        if b not in store:
                            store[b] = zero_storage(prog.nbytes(b))
                    t0 = time.perf_counter()
                    run_op(store, prog.ops[k])
                    ev_kernels.append((k, mb, t0, time.perf_counter()))
                    post_sends(k, mb)
                    cursor[mb] += 1
                    progressed = True
            if not progressed:
                blocking = [(t.index, mb) for mb in range(m) if cursor[mb] < len(mine)
                            for t in recvs.get(mine[cursor[mb]], ()) if (t.index, mb) in pending]
                assert blocking, "every micro-batch blocked but no receive pending"
                t = next(t for t in order if t.index == blocking[0][0])
                wait_until(blocking, f"receive of buffer {t.buffer} from worker {t.src}")
        for mb in range(m):  # end-of-step state syncs
            for t in recvs.get(n, ()):
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
        outputs = {(mb, i): view_of(stores[mb], r).clone() for mb in range(m)
                   for i, r in enumerate(prog.outputs) if part.output_device[i] == me}
        return dict(step_id=cmd.step_id, outputs=outputs, kernels=ev_kernels, sends=ev_sends, recvs=ev_recvs,
                    waits=ev_waits,
                    start_s=t_start, end_s=time.perf_counter())


def probe_link(rank: int, world: int, reps: int = 5) -> tuple[float, float] | None:
    """Rank 0 ping-pongs 4 KiB and 4 MiB with rank 1: (latency_s, bytes_per_s) of one direction."""
    if world < 2 or rank > 1:
        return None
    one_way = []
    for nbytes in (4096, 4 << 20):
        buf = torch.zeros(nbytes, dtype=torch.uint8)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            times.append((time.perf_counter() - t0) / 2)
        one_way.append(sorted(times)[reps // 2])
    bw = ((4 << 20) - 4096) / max(one_way[1] - one_way[0], 1e-9)
    return max(0.0, one_way[0] - 4096 / bw), bw


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
