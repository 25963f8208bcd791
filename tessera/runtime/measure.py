"""What a run measured: per-kernel times, per-link bytes and waits, overlap, a Perfetto trace; and the
prediction for the same steps from single-process kernel times plus a measured gloo link model.

Trace format (Chrome trace JSON, opens in ui.perfetto.dev): complete events ("ph": "X", µs), process 1
"devices" with one thread (track) per device, process 2 "links" with one track per directed link.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.graph import KernelGraph
from tessera.hardware import GpuSpec, LinkSpec, gpu
from tessera.runtime.partition import STEP_START, BufferTransfer, Partition


@dataclass(frozen=True, kw_only=True)
class LinkModel:
    """time(bytes) = latency_s + bytes / bytes_per_s, fitted from two ping-pong sizes between workers, through
    the runtime's own receive path (irecv, a waiting thread, a condition). cpu_*: process CPU time one
    message costs each end (gloo's threads copy the bytes; on 2 cores that time is taken from compute)."""

    latency_s: float
    bytes_per_s: float
    cpu_s: float = 0.0  # per message
    cpu_s_per_byte: float = 0.0
    source: str = "measured between the run's workers 0 and 1 at start-up"

    def time_s(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bytes_per_s

    def cpu_time_s(self, nbytes: int) -> float:
        return self.cpu_s + nbytes * self.cpu_s_per_byte

    def spec(self) -> LinkSpec:
        """As a catalog link, for tessera.plan's evaluation."""
        return LinkSpec(name="gloo-local", bytes_per_s=self.bytes_per_s, latency_s=self.latency_s,
                        source=self.source)


@dataclass(frozen=True, kw_only=True)
class RunMeasurement:
    step_s: list[float]  # wall time of every step, first kernel start to last worker's end
    kernel_s: dict[tuple[str, int], float]  # (step key, kernel) -> median seconds
    link_bytes: dict[tuple[int, int], int]  # directed link -> bytes moved over the run
    wait_s: list[float]  # per device: time with every micro-batch blocked on a transfer
    busy_s: list[float]  # per device: time in kernels
    transfer_s: float  # summed transfer durations (send posted -> arrival noticed)
    overlap: float  # 1 - (time devices waited) / (time transfers took): share of transfer time hidden


def measure(history: list[dict[str, Any]], partitions: dict[tuple[str, str], Partition]) -> RunMeasurement:
    devices = len(history[0]["workers"]) if history else 0
    step_s, wait, busy = [], [0.0] * devices, [0.0] * devices
    ks: dict[tuple[str, int], list[float]] = {}
    link: dict[tuple[int, int], int] = {}
    transfer = 0.0
    for h in history:
        ws = h["workers"]
        step_s.append(max(w["end_s"] for w in ws) - min(w["start_s"] for w in ws))
        part = partitions[(h["key"], h["plan"])]
        posted = {}
        for d, w in enumerate(ws):
            for k, _mb, t0, t1 in w["kernels"]:
                ks.setdefault((h["key"], k), []).append(t1 - t0)
                busy[d] += t1 - t0
            wait[d] += sum(b - a for a, b in w["waits"])
            for idx, mb, t in w["sends"]:
                posted[(idx, mb)] = t
        for w in ws:
            for idx, mb, t in w["recvs"]:
                tr = part.transfers[idx]
                link[(tr.src, tr.dst)] = link.get((tr.src, tr.dst), 0) + tr.nbytes
                transfer += max(0.0, t - posted.get((idx, mb), t))
    total_wait = sum(wait)
    overlap = 1.0 - min(1.0, total_wait / transfer) if transfer > 0 else 1.0
    return RunMeasurement(step_s=step_s, kernel_s={k: statistics.median(v) for k, v in ks.items()},
                          link_bytes=link, wait_s=wait, busy_s=busy, transfer_s=transfer, overlap=overlap)


def predict_step_s(part: Partition, kernel_s: list[float], link: LinkModel, m: int) -> float:
    """m micro-batches of one step on the gloo workers (tessera.plan.solver.verify.list_schedule_s, the workers'
    cyclic policy) over the partition's own transfers: those posted at step start, and the end-of-step
    syncs, which no kernel awaits but whose landing ends the step. A send leaves after its kernel and holds
    its directed link for its bytes."""
    from tessera.plan import Message, list_schedule_s

    n = len(kernel_s)

    def message(t: BufferTransfer) -> Message:
        return Message(key=t.index, link=(t.src, t.dst), hold_s=t.nbytes / link.bytes_per_s,
                       flight_s=link.time_s(t.nbytes))

    sends: dict[int, list[Message]] = {}
    awaits: dict[int, list[int]] = {}
    for t in part.transfers:
        if t.after != STEP_START:
            sends.setdefault(t.after, []).append(message(t))
        if t.before < n:
            awaits.setdefault(t.before, []).append(t.index)
    start = [message(t) for t in part.transfers if t.after == STEP_START]
    return list_schedule_s(part.kernels, kernel_s, awaits, sends, m, start=start)


def charged_kernel_s(part: Partition, kernel_s: list[float], link: LinkModel, per_step_s: float) -> list[float]:
    """Kernel times as a worker sees them: each transfer's CPU cost charged to the kernel that posts it
    (sender) and to the kernel that awaits it (receiver); the per-step fixed cost (storage set-up, output
    copy) to each device's first kernel."""
    out = list(kernel_s)
    n = len(kernel_s)
    for t in part.transfers:
        c = link.cpu_time_s(t.nbytes)
        if t.after != STEP_START:
            out[t.after] += c
        if t.before < n:
            out[t.before] += c
    for ks in part.kernels:
        if ks:
            out[ks[0]] += per_step_s
    return out


class MeasuredKernelCost:
    """tessera.cost's CostModel interface over measured per-kernel times of one graph (CPU profiles), indexed
    by kernel id (the engine's ``ProfileCost`` instead fits each worker kind's times to any kernel)."""

    def __init__(self, kernel_s: list[float], link: LinkModel) -> None:
        self.kernel_s, self.link = kernel_s, link

    def kernel_time_s(self, kernel: object, _gpu: GpuSpec) -> float:
        return self.kernel_s[kernel.id]  # type: ignore[attr-defined]

    def transfer_time_s(self, nbytes: int, _link: LinkSpec) -> float:
        return self.link.time_s(nbytes)


def plan_step_s(graph: KernelGraph, part: Partition, kernel_s: list[float], link: LinkModel, m: int) -> float:
    """tessera run's step of m micro-batches re-synchronised every step, by tessera.plan's evaluation and the
    synchronous chain formula max(m·T, latency + (m−1)·T) (exact for a two-stage chain; predict_step_s
    simulates the workers' own order), fed with CPU-profile kernel times and the measured link."""
    return cost_step_s(graph, part.assignment, part.devices, MeasuredKernelCost(kernel_s, link), link, m)


def cost_step_s(graph: KernelGraph, assignment: tuple[int, ...], devices: int, cost: object, link: LinkModel,
                m: int) -> float:
    """The synchronous chain formula's step time of ``assignment`` on ``devices`` catalog "cpu" devices under
    any cost model (tessera.cost's CostModel, or MeasuredKernelCost)."""
    from tessera.plan import evaluate

    cpus = tuple(gpu("cpu") for _ in range(devices))
    ev = evaluate(graph, assignment, cpus, link.spec(), cost)  # type: ignore[arg-type]
    t = ev.bottleneck_s
    return max(m * t, ev.latency_s + (m - 1) * t)  # micro-batches re-synchronised every step


def chrome_trace(history: list[dict[str, Any]], partitions: dict[tuple[str, str], Partition],
                 names: dict[str, list[str]]) -> dict[str, Any]:
    """names: step key -> kernel names (for event labels)."""
    t0 = min((w["start_s"] for h in history for w in h["workers"]), default=0.0)
    us = lambda t: round((t - t0) * 1e6, 3)  # noqa: E731
    ev: list[dict[str, Any]] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "devices"}},
                                {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "links"}}]
    devices = len(history[0]["workers"]) if history else 0
    for d in range(devices):
        ev.append({"ph": "M", "pid": 1, "tid": d, "name": "thread_name", "args": {"name": f"device {d}"}})
    links: dict[tuple[int, int], int] = {}
    for s, h in enumerate(history):
        part = partitions[(h["key"], h["plan"])]
        posted = {}
        for d, w in enumerate(h["workers"]):
            for k, mb, a, b in w["kernels"]:
                ev.append({"ph": "X", "pid": 1, "tid": d, "ts": us(a), "dur": us(b) - us(a),
                           "name": names[h["key"]][k], "args": {"kernel": k, "microbatch": mb, "step": s}})
            for a, b in w["waits"]:
                ev.append({"ph": "X", "pid": 1, "tid": d, "ts": us(a), "dur": us(b) - us(a), "name": "wait",
                           "args": {"step": s}})
            for idx, mb, t in w["sends"]:
                posted[(idx, mb)] = t
        for w in h["workers"]:
            for idx, mb, t in w["recvs"]:
                tr = part.transfers[idx]
                tid = links.setdefault((tr.src, tr.dst), tr.src * devices + tr.dst)  # stable per link
                a = posted.get((idx, mb), t)
                ev.append({"ph": "X", "pid": 2, "tid": tid, "ts": us(a), "dur": max(0.0, us(t) - us(a)),
                           "name": f"buffer {tr.buffer}", "args": {"bytes": tr.nbytes, "microbatch": mb, "step": s}})
    for (src, dst), tid in links.items():
        ev.append({"ph": "M", "pid": 2, "tid": tid, "name": "thread_name", "args": {"name": f"link {src}->{dst}"}})
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def write_trace(path: str | Path, trace: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(trace))
