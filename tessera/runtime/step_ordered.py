"""The ordered step schedule, for NCCL: every worker issues its work in one global order.

NCCL ignores message tags: a pair's messages match in the order each end issues them, and a send does
not complete until its receive is posted (pytorch/pytorch#94819, NVIDIA/nccl#479). Posting every receive
up front, as the gloo path does, would pair the wrong buffers and can deadlock. So each worker issues, in
the order of a key shared by all workers:

- ``(k, 1, 0)``  run kernel k (its own),
- ``(a, 2, i)``  send transfer i (its own, after its kernel a) -- and on the receiving worker, post the
  receive of transfer i at the same key,
- ``(b, 0, i)``  wait for transfer i before kernel b (a wait only orders the compute stream after it).

A pair's sends and posted receives are then issued in the same (a, i) order at both ends, and every action
waits only on actions with smaller keys (a kernel reads what an earlier kernel wrote: a < b), so by
induction over the key nothing deadlocks. Micro-batches run one after another in the same order on every
worker; on CUDA the host only enqueues (a wait is a stream dependency), so worker d computes micro-batch
j+1 while worker d+1 computes j. On gloo (the CPU check of this schedule) every message uses tag 0, so a
mis-ordered schedule would pair wrong buffers exactly as NCCL would.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

from tessera.runtime.compiled import CompiledOp, call
from tessera.runtime.partition import BufferTransfer, Partition
from tessera.runtime.program import Storages

RUN, SEND, POST, WAIT = 0, 1, 2, 3
Action = tuple[int, Any]  # (RUN, op position) or (SEND | POST | WAIT, BufferTransfer)


def ordered_actions(part: Partition, me: int, n_ops: int) -> tuple[Action, ...]:
    """PartitionWorker ``me``'s actions for one micro-batch of one step, in the shared key order."""
    keyed: list[tuple[tuple[int, int, int], Action]] = []
    for i, k in enumerate(part.kernels[me]):
        keyed.append(((k, 1, 0), (RUN, i)))
    for t in part.transfers:
        if t.src == me:
            keyed.append(((t.after, 2, t.index), (SEND, t)))
        if t.dst == me:
            keyed.append(((t.after, 2, t.index), (POST, t)))
            keyed.append(((t.before, 0, t.index), (WAIT, t)))
            assert t.after < t.before <= n_ops, f"transfer {t.index} is awaited before it is sent"
    keyed.sort(key=lambda x: x[0])
    return tuple(a for _, a in keyed)


def run_ordered(w: Any, ops: tuple[CompiledOp, ...], actions: tuple[Action, ...], stores: list[Storages]
                ) -> dict[str, list]:
    """Issue ``actions`` for each micro-batch in turn. ``w``: the PartitionWorker (its clock; transfer tensors
    through its outgoing/recv_buffer/landed). Times are clock tokens."""
    gloo = w.spec.backend == "gloo"
    timeout = datetime.timedelta(seconds=w.spec.recv_timeout_s)
    mark = w.clock.mark
    kernels: list[tuple[int, int, Any, Any]] = []
    sends: list[tuple[int, int, Any]] = []
    recvs: list[tuple[int, int, Any]] = []
    waits: list[tuple[Any, Any]] = []
    sent: list[tuple[Any, Any]] = []
    for mb, store in enumerate(stores):
        posted: dict[int, tuple[Any, Any]] = {}
        for code, x in actions:
            if code == RUN:
                c = ops[x]
                t0 = mark()
                call(store, c)
                kernels.append((c.kernel, mb, t0, mark()))
            elif code == SEND:
                data = w.outgoing(store[x.buffer], x.snapshot)
                sends.append((x.index, mb, mark()))
                sent.append((dist.isend(data, dst=x.dst, tag=0), data))
            elif code == POST:
                buf = w.recv_buffer(x.nbytes)
                posted[x.index] = (dist.irecv(buf, src=x.src, tag=0), buf)
            else:
                work, buf = posted.pop(x.index)
                t0 = mark()
                _wait(work, x, gloo, timeout, w.rank)
                store[x.buffer] = w.landed(buf)
                t1 = mark()
                waits.append((t0, t1))
                recvs.append((x.index, mb, t1))
        assert not posted, f"receives {sorted(posted)} posted but never awaited"
    for work, _ in sent:
        if gloo:
            work.wait(timeout)
        else:
            work.wait()  # NCCL: orders the stream after the send; the step's synchronize waits for it
    return dict(kernels=kernels, sends=sends, recvs=recvs, waits=waits)


def _wait(work: Any, t: BufferTransfer, gloo: bool, timeout: datetime.timedelta, me: int) -> None:
    """gloo: block until the bytes are here. NCCL: make the compute stream wait for the receive (no host
    block; ``wait(timeout)`` would spin the host; a hung peer is caught by the driver's heartbeat and step
    timeout and by the process group's watchdog)."""
    try:
        if gloo:
            work.wait(timeout)
        else:
            work.wait()
    except Exception as e:  # noqa: BLE001 - the transport's error text is the diagnosis
        raise RuntimeError(f"worker {me}: receive of buffer {t.buffer} from worker {t.src} failed: "
                           f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
