"""The link as the runtime sees it: a ping-pong between workers 0 and 1 through the step's receive path."""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

from tessera.runtime.step_threaded import Waiters


def _recv_like_a_step(buf: torch.Tensor, src: int, waiters: Waiters) -> None:
    """Receive as a step does. gloo: irecv, a waiter thread blocked in wait(), the main thread woken by a
    condition. NCCL: the stream waits for the receive, the host for the stream (the clock is the host's)."""
    if buf.device.type == "cuda":
        dist.irecv(buf, src=src).wait()
        torch.cuda.synchronize(buf.device)
        return
    work, cond, done = dist.irecv(buf, src=src), threading.Condition(), []

    def waiter() -> None:
        work.wait()
        with cond:
            done.append(True)
            cond.notify_all()

    waiters.run(0, waiter)
    with cond:
        cond.wait_for(lambda: bool(done))


def probe_link(rank: int, world: int, device: torch.device, waiters: Waiters | None = None, reps: int = 31,
               warmup: int = 3) -> tuple[float, float, float, float] | None:
    """Rank 0 ping-pongs 4 KiB and 4 MiB with rank 1 through the step's send/receive path, with buffers on
    ``device`` (where the transport's tensors live: the host for gloo, the GPU for NCCL; a CUDA worker's
    staging copies over gloo are not included). Returns one direction's (latency_s, bytes_per_s) and the
    process CPU time a message costs one end (cpu_s per message, cpu_s per byte), from medians; None on
    workers that do not take part. Rank 0 sends first and rank 1 receives first: NCCL pairs in issue order.
    ``warmup`` round trips per size are not counted; ``reps`` are, medians of many: on a shared machine a
    few probes swung the fitted latency several-fold."""
    if world < 2 or rank > 1:
        return None
    peer = 1 - rank
    wall, cpu = [], []
    waiters = waiters or Waiters()  # the worker's own receive threads, as its steps use them
    sizes = (4096, 4 << 20)
    for nbytes in sizes:
        buf = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        ts, cs = [], []
        for i in range(warmup + reps):
            c0, t0 = time.process_time(), time.perf_counter()
            if rank == 0:
                dist.isend(buf, peer).wait()
                _recv_like_a_step(buf, peer, waiters)
            else:
                _recv_like_a_step(buf, peer, waiters)
                dist.isend(buf, peer).wait()
            if i >= warmup:
                ts.append((time.perf_counter() - t0) / 2)
                cs.append((time.process_time() - c0) / 2)  # a send and a receive per round trip at each end
        wall.append(sorted(ts)[reps // 2])
        cpu.append(sorted(cs)[reps // 2])
    span = sizes[1] - sizes[0]
    bw = span / max(wall[1] - wall[0], 1e-9)
    cpu_per_byte = max(0.0, cpu[1] - cpu[0]) / span
    return (max(0.0, wall[0] - sizes[0] / bw), bw, max(0.0, cpu[0] - sizes[0] * cpu_per_byte), cpu_per_byte)
