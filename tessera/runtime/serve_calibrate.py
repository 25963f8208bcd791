"""Kernel times for a prediction taken from the served run itself (its workers' own kernel events).

Why: on a shared 2-core machine a single-process profile taken minutes earlier, or on an idle core, prices
kernels at another speed than the run met (load from other jobs slows both workers alike). The run's own
events give, under the same conditions:

- each kernel's mean duration per program (means, not medians: throughput pays the total time, tails
  included);
- per device, the worker's time per kernel outside kernels and outside waits (dispatch, the receive
  threads, gloo's copies, storage set-up): (step span − kernel time − blocked time) / kernels run, over
  the whole run;
- per device, the time between two steps when the next was already queued (its command off the queue,
  the last outputs handed back): what a worker pays per iteration when groups run back to back;
- the control round trip per iteration: the driver's submit to the first worker's start (when that worker
  was idle, so not queueing behind another group's iteration), plus the last worker's end to the driver
  holding the outputs, plus the driver's turnaround to the group's next submit; means.

What stays a prediction: how these costs combine under the placement and the schedule (each device's
load per iteration, the pipeline latency through the placement over the link, max(m·T, L), the slots'
occupancy, and tessera.sim's queueing), which is what the serving model claims.
"""

from __future__ import annotations

import statistics
from itertools import pairwise
from typing import Any

from tessera.runtime.program import Program
from tessera.runtime.serve_predict import KernelTimes


def _control_s(history: tuple[dict[str, Any], ...]) -> float:
    """Mean launch (submit -> first start on an idle worker) plus mean return (last end -> driver) plus the
    driver's mean turnaround (outputs in hand -> the same group's next submit: tokens taken, next inputs
    built; only for iterations submitted straight after their group's previous one, not after a wait for
    arrivals or a recovery). Means: throughput pays every round trip, and on a busy 2-core machine their
    tails are long (mean launch 1.6 ms against a 1.3 ms median, seen on mamba2-tiny)."""
    launch, back, turn = [], [], []
    prev_end: dict[int, float] = {}
    last_done: dict[int, float] = {}  # group -> when its previous iteration's outputs reached the driver
    for h in sorted(history, key=lambda h: h["submit_abs_s"]):
        g = h.get("group")
        if g is not None and h.get("continued") and g in last_done:
            turn.append(max(0.0, h["submit_abs_s"] - last_done[g]))
        if g is not None:
            last_done[g] = h["done_abs_s"]
    for h in sorted(history, key=lambda h: min(w["start_s"] for w in h["workers"])):
        ws = h["workers"]
        idle = [w["start_s"] - h["submit_abs_s"] for d, w in enumerate(ws) if prev_end.get(d, 0.0) <= h["submit_abs_s"]]
        if idle:
            launch.append(max(0.0, min(idle)))
        back.append(max(0.0, h["done_abs_s"] - max(w["end_s"] for w in ws)))
        for d, w in enumerate(ws):
            prev_end[d] = w["end_s"]
    return sum(statistics.mean(x) if x else 0.0 for x in (launch, back, turn))


def _step_gap_s(history: tuple[dict[str, Any], ...], devices: int) -> tuple[float, ...]:
    """Per device, the mean time from the end of one step to the start of the next when the next had been
    submitted before the first ended (so the worker was not waiting for the driver): taking a command
    off the queue and handing the outputs back. Means: throughput pays every one."""
    out = []
    for d in range(devices):
        steps = sorted(((h["submit_abs_s"], h["workers"][d]) for h in history if d < len(h["workers"])),
                       key=lambda x: x[1]["start_s"])  # after a recovery the cluster is smaller
        gaps = [nxt["start_s"] - prev["end_s"] for (_, prev), (sub, nxt) in pairwise(steps)
                if sub < prev["end_s"] <= nxt["start_s"]]
        out.append(statistics.mean(gaps) if gaps else 0.0)
    return tuple(out)


def in_run_times(history: tuple[dict[str, Any], ...], programs: dict[str, Program], fallback: KernelTimes
                 ) -> KernelTimes:
    """KernelTimes from a served stream's iterations (``StreamResult.history``); a kernel the run never
    ran (a program no request needed after a recovery) keeps its ``fallback`` time."""
    sums: dict[str, list[float]] = {k: [0.0] * len(p.ops) for k, p in programs.items()}
    counts: dict[str, list[int]] = {k: [0] * len(p.ops) for k, p in programs.items()}
    devices = len(history[0]["workers"]) if history else 0
    outside, ran = [0.0] * devices, [0] * devices
    for h in history:
        keys = h["keys"]
        for d, w in enumerate(h["workers"]):
            in_kernels = 0.0
            for k, mb, a, b in w["kernels"]:
                sums[keys[mb]][k] += b - a
                counts[keys[mb]][k] += 1
                in_kernels += b - a
            blocked = sum(b - a for a, b in w["waits"])
            outside[d] += max(0.0, w["end_s"] - w["start_s"] - in_kernels - blocked)
            ran[d] += len(w["kernels"])
    kernel_s = {k: [s / c if c else f for s, c, f in zip(sums[k], counts[k], fallback.kernel_s[k], strict=True)]
                for k in programs}
    return KernelTimes(kernel_s=kernel_s, dispatch_s=tuple(o / n if n else 0.0 for o, n in zip(outside, ran, strict=True)),
                       control_s=_control_s(history), step_gap_s=_step_gap_s(history, devices), source="in-run")


__all__ = ["in_run_times"]
