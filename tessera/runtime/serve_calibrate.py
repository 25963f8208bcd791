"""Kernel times for a prediction taken from the served run itself (its workers' own kernel events).

Why: on a shared 2-core machine a single-process profile taken minutes earlier, or on an idle core, prices
kernels at another speed than the run met (load from other jobs slows both workers alike). The run's own
events give, under the same conditions:

- each kernel's mean duration per program (means, not medians: throughput pays the total time, tails
  included);
- per device, the worker's time per kernel outside kernels and outside waits (dispatch, the receive
  threads, gloo's copies, storage set-up): (time with a step in flight − time blocked − kernel time) /
  kernels run, over the whole run (a worker runs several groups' steps at once: their spans overlap and
  are counted once);
- per device, the time between two steps when the next was already queued (its command off the queue,
  the last outputs handed back): what a worker pays per iteration when groups run back to back;
- the control round trip per iteration: the driver's submit to the first worker's start (when that worker
  was idle, so not queueing behind another group's iteration), plus the last worker's end to the driver
  holding the outputs, plus the driver's turnaround to the group's next submit; means;
- the link's latency under the run's load: the mean time from a send to its arrival at a receiver that was
  already blocked waiting for it (the wire, gloo, and the receiving thread's wake-up; not the time a busy
  receiver took to look). The start-up probe's median ping-pong, taken with both cores idle, sees none of
  the wake-ups' long tail, which a mean over the run pays;
- how much a device's busy time per step and the control round trip vary from iteration to iteration (standard
  deviations over all but the 1% most extreme at each end, at least one, so that a rare stall of a hundred
  milliseconds, already paid in the means, does not also count as spread): a stream mixes prompt chunks and
  decodes in its steps, and on shared cores the same step varies too. Not the interquartile range: with one
  request per group a sixth of llama-wide's steps carry a prompt chunk and cost 2.5 times a decode, and a
  quartile-based spread, which cannot see a mode under a quarter of the samples, put the steps' spread at 1.4
  ms against their 6.8 ms standard deviation.

What stays a prediction: how these costs combine under the placement and the schedule (each device's
load per iteration, the pipeline latency through the placement over the link, the period, the slots'
occupancy, and tessera.sim's queueing), which is what the serving model claims.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from tessera.runtime.program import Program
from tessera.runtime.serve_predict import KernelTimes, Overheads
from tessera.runtime.serving import worker_timeline


def spread(xs: list[float], trim: float = 0.01) -> float:
    """The standard deviation of ``xs`` without its ``trim`` share of most extreme values at each end (the
    lowest and highest ⌈trim·n⌉, so at least the single most extreme of a short run); 0 under 4 samples.
    Keeps a minority mode (prompt steps among decodes), which is step-to-step variation the period pays,
    and drops rare stalls, whose cost the means hold."""
    if not 0 <= trim < 0.5:
        raise ValueError(f"spread's trim must be in [0, 0.5), got {trim}")
    if len(xs) < 4:
        return 0.0
    k = min(math.ceil(len(xs) * trim), (len(xs) - 2) // 2)  # two values left at least
    kept = sorted(xs)[k:len(xs) - k]
    return statistics.stdev(kept)


def _control(history: tuple[dict[str, Any], ...]) -> tuple[float, float]:
    """The control round trip's mean and spread (the three parts' spreads combined as independent).
    Mean launch (submit -> first start on an idle worker) plus mean return (last end -> driver) plus the
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
        for d, w in enumerate(ws):  # steps of several groups overlap on a worker: the latest end so far
            prev_end[d] = max(prev_end.get(d, 0.0), w["end_s"])
    parts = (launch, back, turn)
    return sum(statistics.mean(x) if x else 0.0 for x in parts), math.hypot(*(spread(x) for x in parts))


def _step_gap_s(history: tuple[dict[str, Any], ...], devices: int) -> tuple[float, ...]:
    """Per device, the mean time from the end of the steps in flight to the start of the next step when
    that step had been submitted before they ended (so the worker was not waiting for the driver): taking
    a command off the queue and handing the outputs back, outside any step span. Steps of several groups
    overlap on a worker: "the end" is the latest end among the steps started before. Means: throughput
    pays every one."""
    out = []
    for d in range(devices):
        steps = sorted(((h["submit_abs_s"], h["workers"][d]) for h in history if d < len(h["workers"])),
                       key=lambda x: x[1]["start_s"])  # after a recovery the cluster is smaller
        gaps, reach = [], -math.inf
        for sub, w in steps:
            if sub < reach <= w["start_s"]:
                gaps.append(w["start_s"] - reach)
            reach = max(reach, w["end_s"])
        out.append(statistics.mean(gaps) if gaps else 0.0)
    return tuple(out)


def _step_busy_s(w: dict[str, Any], dispatch_s: float) -> float:
    """A worker's busy time for one step: its kernels plus its share of the time outside them (``dispatch_s``
    per kernel). Not its span less its waits: a worker runs several groups' steps at once, so a step's span
    holds other steps' kernels."""
    return sum(b - a for _, _, a, b in w["kernels"]) + len(w["kernels"]) * dispatch_s


def _step_spread_s(history: tuple[dict[str, Any], ...], devices: int, dispatch_s: tuple[float, ...]
                   ) -> tuple[float, ...]:
    """Per device, the spread of its busy time per step, over the iterations run on the first iteration's
    cluster (after a recovery a survivor's steps hold other work)."""
    same = [h for h in history if len(h["workers"]) == devices]
    return tuple(spread([_step_busy_s(h["workers"][d], dispatch_s[d]) for h in same]) for d in range(devices))


def _link_latency_s(history: tuple[dict[str, Any], ...]) -> float | None:
    """Mean send -> arrival over the transfers whose receiver was blocked waiting from before the send until
    the arrival; None without any (one worker: nothing travels). The bytes' own time is in it too and is
    counted again by the link model's bandwidth term: microseconds for these activations (a few KB at GB/s)
    against a latency of tenths of a millisecond."""
    seen = []
    for h in history:
        sent = {(idx, mb): t for w in h["workers"] for idx, mb, t in w.get("sends", ())}
        for w in h["workers"]:
            for idx, mb, arrived in w.get("recvs", ()):
                s = sent.get((idx, mb))
                if s is not None and any(a <= s and arrived <= b for a, b in w["waits"]):
                    seen.append(arrived - s)
    return statistics.mean(seen) if seen else None


def in_run_times(history: tuple[dict[str, Any], ...], programs: dict[str, Program], fallback: KernelTimes
                 ) -> KernelTimes:
    """KernelTimes from a served stream's iterations (``StreamResult.history``); a kernel the run never
    ran (a program no request needed after a recovery) keeps its ``fallback`` time."""
    sums: dict[str, list[float]] = {k: [0.0] * len(p.ops) for k, p in programs.items()}
    counts: dict[str, list[int]] = {k: [0] * len(p.ops) for k, p in programs.items()}
    devices = len(history[0]["workers"]) if history else 0
    for h in history:
        keys = h["keys"]
        for w in h["workers"]:
            for k, mb, a, b in w["kernels"]:
                sums[keys[mb]][k] += b - a
                counts[keys[mb]][k] += 1
    dispatch = []
    for d in range(devices):
        span, waits, in_kernels, ran = worker_timeline(history, d)
        dispatch.append(max(0.0, span - waits - in_kernels) / ran if ran else 0.0)
    kernel_s = {k: [s / c if c else f for s, c, f in zip(sums[k], counts[k], fallback.kernel_s[k], strict=True)]
                for k in programs}
    control_s, control_sd_s = _control(history)
    over = Overheads(control_s=control_s, gap_s=_step_gap_s(history, devices), control_sd_s=control_sd_s,
                     step_sd_s=_step_spread_s(history, devices, tuple(dispatch)))
    return KernelTimes(kernel_s=kernel_s, dispatch_s=tuple(dispatch), overheads=over,
                       link_latency_s=_link_latency_s(history), source="in-run")


__all__ = ["in_run_times", "spread"]
