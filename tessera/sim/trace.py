"""Per-device and per-link busy spans of an iteration, and the Chrome-trace (Perfetto) writer.

A serving-model ("mixed") plan's spans are its simulated stages (tessera.sim.stages). A two-phase Plan
stores per micro-batch busy seconds per device and per link, not the order of kernels, so its spans are
laid out as the pipeline implies: devices in the order the phase's kernels first reach them
(``assignment`` is in program order), micro-batch ``j`` of a device starts ``j·T`` after the iteration
start (T = the busiest device or link per micro-batch) plus the device's stage offset (sum of the busy and
transfer times of the stages before it). Each span is a device's kernels for one micro-batch drawn as one
busy block; a link span is that micro-batch's transfers on the link. If the layout overruns the
iteration's step time (extrapolated shapes) it is compressed to fit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.contracts.plan import Plan
from tessera.sim.timing import Weights


@dataclass(frozen=True, kw_only=True)
class Span:
    row: str  # "dev0 H100-SXM" or "link 0->1"
    start_s: float
    dur_s: float
    microbatch: int
    kind: str  # compute | link
    phase: str


def iteration_spans(plan: Plan, phase: str, w: Weights, start_s: float, dur_s: float) -> list[Span]:
    """One iteration's spans: micro-batch j enters T·j after the first (T the busiest device's time),
    squeezed into ``dur_s`` when the layout overruns it."""
    p = plan.phases[phase]
    pts = p.points
    ndev = len(plan.devices)
    busy = [sum(wi * pts[i].device_busy_s[d] for i, wi in w) for d in range(ndev)]
    links: dict[tuple[int, int], float] = {}
    for i, wi in w:
        for s, d, sec in pts[i].link_busy_s:
            links[(int(s), int(d))] = links.get((int(s), int(d)), 0.0) + wi * sec
    m = max(1, p.microbatches)
    period = max([*busy, *links.values(), 1e-12])
    order = list(dict.fromkeys(p.assignment)) + [d for d in range(ndev) if busy[d] > 0 and d not in p.assignment]
    offset, acc = {}, 0.0
    for k, d in enumerate(order):
        offset[d] = acc
        nxt = order[k + 1] if k + 1 < len(order) else None
        acc += busy[d] + (links.get((d, nxt), 0.0) if nxt is not None else 0.0)
    spans = []
    for j in range(m):
        for d in order:
            if busy[d] > 0:
                spans.append(Span(row=f"dev{d} {plan.devices[d].gpu}", start_s=j * period + offset[d],
                                  dur_s=busy[d], microbatch=j, kind="compute", phase=phase))
        for (s, d), sec in sorted(links.items()):
            if sec > 0:
                spans.append(Span(row=f"link {s}->{d}", start_s=j * period + offset.get(s, 0.0) + busy[s],
                                  dur_s=sec, microbatch=j, kind="link", phase=phase))
    end = max((s.start_s + s.dur_s for s in spans), default=0.0)
    k = dur_s / end if end > dur_s > 0 else 1.0
    return [Span(row=s.row, start_s=start_s + s.start_s * k, dur_s=s.dur_s * k, microbatch=s.microbatch,
                 kind=s.kind, phase=s.phase) for s in spans]


def write_chrome_trace(path: str | Path, plans: dict[str, Plan], records: list[tuple],
                       spans: Sequence[tuple] = ()) -> int:
    """Write trace records (from a run with a trace window) as Chrome trace JSON; returns event count.
    One process per replica; one thread per device, per link and per lane (iteration spans; a mixed plan's
    lane is a group). A mixed plan's device and link spans are the simulated stages themselves (``spans``,
    tessera.sim.replica.RequestArrays.spans); other plans' are laid out from each iteration's busy seconds."""
    events: list[dict] = []
    tids: dict[tuple[int, str], int] = {}

    def tid(rep: int, row: str) -> int:
        if (rep, row) not in tids:
            tids[(rep, row)] = len(tids) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": rep, "tid": tids[(rep, row)],
                           "args": {"name": row}})
        return tids[(rep, row)]

    for rep in sorted({r[0] for r in records} | {s[0] for s in spans}):
        events.append({"ph": "M", "name": "process_name", "pid": rep, "args": {"name": f"replica {rep}"}})
    for rep, mode, row, group, t, dur in spans:
        kind = "link" if row.startswith("link") else "compute"
        events.append({"ph": "X", "name": f"mixed mb{group}", "cat": kind, "pid": rep, "tid": tid(rep, row),
                       "ts": t * 1e6, "dur": dur * 1e6, "args": {"mode": mode}})
    for rep, lane, mode, phase, t, dur, w, batch in records:
        events.append({"ph": "X", "name": phase, "cat": "iteration", "pid": rep, "tid": tid(rep, f"lane {lane}"),
                       "ts": t * 1e6, "dur": dur * 1e6, "args": {"batch": batch, "mode": mode}})
        if w is None:  # a mixed iteration: its stages are in ``spans``
            continue
        for s in iteration_spans(plans[mode], phase, w, t, dur):
            events.append({"ph": "X", "name": f"{phase} mb{s.microbatch}", "cat": s.kind, "pid": rep,
                           "tid": tid(rep, s.row), "ts": s.start_s * 1e6, "dur": s.dur_s * 1e6})
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return len(events)
