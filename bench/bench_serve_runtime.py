"""Serving a request stream on 2 CPU workers (tessera serve-run): tokens per request vs the single-process
reference, async vs sync on the same placement, measured vs predicted (planner's serving model) vs
simulated (tessera.sim), and a worker SIGKILLed mid-stream.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_serve_runtime.py [--quick]
Writes bench/results/serve_runtime.json and .md; each row records os.getloadavg() after its run (the
machine is shared: predictions assume both cores free).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from tessera.runtime.repeats import paired_ratio
from tessera.runtime.serve_api import ServeRunSpec, serve_run
from tessera.runtime.serving import Fault, ServeConfig
from tessera.sim.workload import LengthSpec, WorkloadSpec

OUT = Path(__file__).parent / "results"
# llama-wide (hidden 1024, 4 layers): a batch-1 step is ~14 ms of GEMMs on one core, so the work scales with
# the requests in an iteration; on the tiny models per-kernel dispatch and per-step set-up dominate
MODELS = ("llama-tiny", "mamba2-tiny", "moe-tiny", "llama-wide")
PLACEMENTS = ("plan", "layer_split")


SLOTS, MICROBATCHES, CHUNK = 4, 2, 8
# Output lengths (tokens). Prompts of 4-16 in chunks of 8 take 1.6 steps on average, so SHORT outputs put a
# prompt chunk in 15% of the steps (the Azure 2023 code trace shipped in tessera/sim/data: 17% at 512-token
# chunks) and LONG ones in 3% (its conversation trace: 1.2%)
SHORT, LONG = (4, 16), (32, 64)


def workload(n: int, outputs: tuple[int, int] = SHORT) -> WorkloadSpec:
    # 200 requests/s saturates the slots on this machine (a few tens of requests/s of capacity): the stream
    # measures capacity, which is what the serving model and the simulator predict. Prompts of 4-16 tokens
    # in chunks of 8: the longer half is prefilled over two iterations.
    return WorkloadSpec(kind="poisson", requests=n, rate_per_s=200.0, prompt=LengthSpec(lo=4, hi=16),
                        output=LengthSpec(lo=outputs[0], hi=outputs[1]))


def row(model: str, placement: str, n: int, repeats: int, fault: Fault | None = None, *, slots: int = SLOTS,
        microbatches: int = MICROBATCHES, outputs: tuple[int, int] = SHORT) -> dict[str, Any]:
    # 4 slots in 2 groups: few requests per iteration, so the synchronous schedule's per-iteration bubble
    # (pipeline fill and drain, the driver's round trip) is a visible share that async can overlap
    spec = ServeRunSpec(model=model, devices=("cpu", "cpu"), workload=workload(n, outputs),
                        serve=ServeConfig(slots=slots, microbatches=microbatches, schedule="async",
                                          chunk_tokens=CHUNK),
                        placement=placement, compare_sync=fault is None, repeats=repeats if fault is None else 1,
                        recover=fault is not None, fault=fault)
    corun = corun_check() if fault is None else None  # this machine's second core, just before the row
    t0 = time.monotonic()
    r = serve_run(spec)
    e = r.extra
    pa, ps = e["prediction"]["async"], e["prediction"].get("sync")
    runs = e["runs_throughput_tokens_per_s"]
    meas, sync = r.measured_throughput_tokens_per_s, r.sync_throughput_tokens_per_s
    err = lambda x, ref: None if x is None or not ref else x / ref - 1  # noqa: E731
    sim = pa["in_run"]["simulated"]
    out = {
        "model": model, "placement": placement, "slots": slots, "microbatches": microbatches,
        "outputs": list(outputs), "requests": r.requests, "completed": r.completed, "lost": r.lost,
        "verified": r.verified, "tokens_identical": r.tokens_identical, "max_abs_diff": r.max_abs_diff,
        "measured_tokens_per_s": meas, "sync_tokens_per_s": sync,
        "async_over_sync": meas / sync if sync else None,
        # each repeat's pair (the schedules run back to back, A B then B A): the spread of the ratio itself
        "paired_async_over_sync": [a / b for a, b in zip(runs["async"], runs.get("sync", []), strict=False)],
        # what the serving model expects of the same comparison, each schedule priced from its own run
        "predicted_async_over_sync": (r.predicted_throughput_tokens_per_s / ps["in_run"]["throughput_tokens_per_s"]
                                      if ps else None),
        "predicted_tokens_per_s": r.predicted_throughput_tokens_per_s,
        "simulated_tokens_per_s": r.simulated_throughput_tokens_per_s,
        "predicted_error": err(r.predicted_throughput_tokens_per_s, meas),
        "simulated_error": err(r.simulated_throughput_tokens_per_s, meas),
        "predicted_sync_tokens_per_s": ps["in_run"]["throughput_tokens_per_s"] if ps else None,
        "predicted_sync_error": err(ps["in_run"]["throughput_tokens_per_s"], sync) if ps else None,
        "profile_predicted_error": err(pa["profile"]["throughput_tokens_per_s"], meas),
        "profile_simulated_error": err(pa["profile"]["simulated"]["throughput_tokens_per_s"], meas),
        "tpot_p50_s": r.tpot_s["p50"], "predicted_tpot_s": pa["in_run"]["tpot_s"],
        "simulated_tpot_p50_s": sim["tpot_s"]["p50"],
        "predicted_tpot_error": err(pa["in_run"]["tpot_s"], r.tpot_s["p50"]),
        "simulated_tpot_error": err(sim["tpot_s"]["p50"], r.tpot_s["p50"]),
        "ttft_p50_s": r.ttft_s["p50"], "ttft_p99_s": r.ttft_s["p99"],
        "runs_tokens_per_s": runs, "runs_load_avg": e["runs_load_avg"],
        "mixed_iterations": e["mixed_iterations"], "recoveries": e["recoveries"], "link": e["link"],
        "prediction": e["prediction"], "utilisation": e["utilisation"], "corun": corun, "wall_s": time.monotonic() - t0,
        "load_avg": os.getloadavg(),
    }
    print(json.dumps({k: out[k] for k in ("model", "placement", "verified", "measured_tokens_per_s",
                                          "sync_tokens_per_s", "predicted_tokens_per_s", "simulated_tokens_per_s",
                                          "tpot_p50_s", "predicted_tpot_s", "runs_tokens_per_s", "load_avg")}),
          flush=True)
    return out


def _corun_worker(n: int, out: Any) -> None:
    """Time a decode-shaped GEMV (46 MB of fp32 weights, memory-bound) and a cache-resident 256² GEMM
    (compute-bound) on one thread; ms per call."""
    torch.set_num_threads(1)
    w, x = torch.randn(2816, 4096), torch.randn(4096, 1)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    for _ in range(3):
        w @ x, a @ b
    t0 = time.perf_counter()
    for _ in range(n):
        w @ x
    t1 = time.perf_counter()
    for _ in range(20 * n):
        a @ b
    out.put(((t1 - t0) / n * 1e3, (time.perf_counter() - t1) / (20 * n) * 1e3))


def cpu_jiffies() -> list[int]:
    """/proc/stat's first line: user, nice, system, idle, iowait, irq, softirq, steal (all CPUs); [] elsewhere."""
    try:
        return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except OSError:
        return []


def corun_check(n: int = 60) -> dict[str, Any]:
    """What a second busy worker costs the first on this machine: the same kernels in 1 process, then in 2
    at once. On 2 free cores the 2-process times equal the 1-process ones; the asynchronous schedule's gain
    assumes that (a worker's idle time in the synchronous schedule is a core left unused)."""
    ctx = mp.get_context("spawn")
    got: dict[str, Any] = {}
    for k in (1, 2):
        before = cpu_jiffies()
        q = ctx.Queue()
        procs = [ctx.Process(target=_corun_worker, args=(n, q)) for _ in range(k)]
        for p in procs:
            p.start()
        res = [q.get() for _ in procs]
        for p in procs:
            p.join()
        got[f"{k}_proc_gemv_ms"] = statistics.mean(r[0] for r in res)
        got[f"{k}_proc_gemm_ms"] = statistics.mean(r[1] for r in res)
        delta = [b - a for a, b in zip(before, cpu_jiffies(), strict=False)]
        # niced processes' (other jobs at lower priority) and idle shares meanwhile
        if delta and sum(delta) > 0:
            got[f"{k}_proc_niced_share"], got[f"{k}_proc_idle_share"] = delta[1] / sum(delta), delta[3] / sum(delta)
    got["load_avg"] = os.getloadavg()
    return got


def corun_cell(c: dict[str, Any] | None) -> str:
    if not c:
        return "-"
    niced = c.get("2_proc_niced_share")
    return (f"{c['2_proc_gemv_ms'] / c['1_proc_gemv_ms']:.2f}x / {c['2_proc_gemm_ms'] / c['1_proc_gemm_ms']:.2f}x "
            f"({c['1_proc_gemv_ms']:.1f}→{c['2_proc_gemv_ms']:.1f} ms"
            + ("" if niced is None else f"; niced jobs {niced:.0%} of the cores") + ")")


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.0%}"


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def shares(u: dict[str, Any]) -> str:
    """Per worker busy / CPU share of the stream's wall time, then the driver's CPU share."""
    ws = " ".join(f"{w['busy']:.2f}/{w['cpu']:.2f}" for w in u["workers"])
    return f"{ws} · {u['driver_cpu']:.2f}"


def times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def join(xs: Any, fmt: str = ".2f") -> str:
    return " ".join(f"{x:{fmt}}" for x in xs)


def pairs_cell(r: dict[str, Any]) -> str:
    """The lowest and highest of the repeats' own async/sync ratios."""
    p = r["paired_async_over_sync"]
    return f"{min(p):.2f}-{max(p):.2f}x" if p else "-"


def bound_cell(r: dict[str, Any]) -> str:
    """The repeats' paired async/sync: geometric mean and its one-sided 90% lower bound (Student's t)."""
    runs = r["runs_tokens_per_s"]
    if len(runs.get("sync", [])) < 2:
        return "-"
    pr = paired_ratio(runs["async"], runs["sync"])
    return f"{pr.geomean:.2f}x ≥ {pr.lower:.2f}x"


def runs_cell(r: dict[str, Any]) -> str:
    """Every repeat's throughput, async / sync."""
    runs = r["runs_tokens_per_s"]
    return f"{join(runs['async'], '.0f')} / {join(runs.get('sync', []), '.0f')}"


def time_table(rows: list[dict[str, Any]]) -> str:
    """Where each schedule's time went (the median run): busy = the worker inside a step, CPU = its process
    actually on a core; outside = per micro-batch step, time in a step neither in kernels nor blocked."""
    lines = ["| model | placement | schedule | workers busy/CPU · driver CPU | kernels | outside ms per request-step "
             "| kernel seconds, both workers | kernel slowdown while the other worker computes | steps per worker |",
             "|" + "---|" * 9]
    for r in rows:
        for sched, u in r["utilisation"].items():
            if not u:
                continue
            lines.append(f"| {r['model']} | {r['placement']} | {sched} | {shares(u)} | "
                         f"{join(w['kernels'] for w in u['workers'])} | "
                         f"{join(w['outside_ms'] for w in u['workers'])} | {kernel_seconds(r, sched):.2f} | "
                         f"{' '.join(times(w['corun_slowdown']) for w in u['workers'])} | "
                         f"{' '.join(str(w['steps']) for w in u['workers'])} |")
    return "\n".join(lines)


def kernel_seconds(r: dict[str, Any], schedule: str) -> float:
    """Seconds both workers spent inside kernels over the schedule's median run (the same requests and tokens
    under either schedule, so a ratio above 1 is kernels running slower while both cores compute)."""
    u = r["utilisation"][schedule]
    return sum(w["kernels"] for w in u["workers"]) * u["wall_s"]


def sweep_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | placement | outputs (requests) | slots / groups | async tok/s | sync tok/s | "
             "async/sync | each repeat's async/sync | paired mean ≥ 90% bound | model's async/sync | "
             "kernel seconds async/sync | predicted err | simulated err | runs async / sync tok/s | load |",
             "|" + "---|" * 15]
    for r in rows:
        lo, hi = r.get("outputs", SHORT)  # JSON written before the field: the short outputs
        lines.append(
            f"| {r['model']} | {r['placement']} | {lo}-{hi} ({r['requests']}) | "
            f"{r['slots']} / {r['microbatches']} | "
            f"{r['measured_tokens_per_s']:.0f} | {r['sync_tokens_per_s']:.0f} | {r['async_over_sync']:.2f}x | "
            f"{pairs_cell(r)} | {bound_cell(r)} | {r['predicted_async_over_sync']:.2f}x | "
            f"{kernel_seconds(r, 'async') / kernel_seconds(r, 'sync'):.2f}x | "
            f"{pct(r['predicted_error'])} | {pct(r['simulated_error'])} | "
            f"{runs_cell(r)} | {join(r['load_avg'], '.1f')} |")
    return ("Asynchronous vs synchronous by traffic, slots and groups (async: the slots in groups advancing "
            "on their own; sync: one group of every slot, its requests pipelined through the workers and "
            "re-synchronised every iteration). With one request per group the synchronous iteration's "
            "pipeline fill and drain is the largest share of it. Outputs 4-16: a prompt chunk (2.5 decodes' "
            "work on llama-wide) in 15% of the steps, like the Azure 2023 code trace (17% at 512-token "
            "chunks); 32-64: in 3%, nearer its conversation trace (1.2%); a group whose step carries a chunk "
            "holds the worker the other group's next step needs. Each repeat's async/sync: the lowest and "
            "highest ratio of a repeat's two back-to-back runs; paired mean ≥ bound: those ratios' geometric "
            "mean and its one-sided 90% "
            "lower confidence bound (Student's t on their logs), the figure a threshold is read against; "
            "kernel seconds: both workers' time inside kernels, async over "
            "sync, for the same requests and tokens.\n\n" + "\n".join(lines) + "\n")


def table(rows: list[dict[str, Any]], fault: dict[str, Any] | None) -> str:
    lines = ["| model | placement | requests | lost | tokens identical | async tok/s | sync tok/s | async/sync | "
             "each repeat's async/sync | paired mean ≥ 90% bound | model's async/sync | "
             "2nd process GEMV / GEMM slowdown | "
             "predicted | err | simulated | err | sync predicted err | TPOT p50 ms | predicted | err | simulated | "
             "err | profile-only err (pred/sim) | TTFT p50 ms | runs async / sync tok/s | load (1/5/15 min) |",
             "|" + "---|" * 26]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['placement']} | {r['requests']} | {r['lost']} | {r['tokens_identical']} | "
            f"{r['measured_tokens_per_s']:.0f} | {r['sync_tokens_per_s']:.0f} | {r['async_over_sync']:.2f}x | "
            f"{pairs_cell(r)} | {bound_cell(r)} | {r['predicted_async_over_sync']:.2f}x | "
            f"{corun_cell(r['corun'])} | "
            f"{r['predicted_tokens_per_s']:.0f} | {pct(r['predicted_error'])} | {r['simulated_tokens_per_s']:.0f} | "
            f"{pct(r['simulated_error'])} | {pct(r['predicted_sync_error'])} | {ms(r['tpot_p50_s'])} | "
            f"{ms(r['predicted_tpot_s'])} | {pct(r['predicted_tpot_error'])} | {ms(r['simulated_tpot_p50_s'])} | "
            f"{pct(r['simulated_tpot_error'])} | {pct(r['profile_predicted_error'])} / "
            f"{pct(r['profile_simulated_error'])} | {ms(r['ttft_p50_s'])} | "
            f"{runs_cell(r)} | {join(r['load_avg'], '.1f')} |")
    if fault:
        (rec,) = fault["recoveries"] or [{}]
        lines += ["", f"Fault: {fault['model']} ({fault['placement']}), worker 1 SIGKILLed when request "
                  f"{fault['kill_at']} of "
                  f"{fault['requests']} was admitted: {rec.get('failure')}; detected {rec.get('detection_s', 0):.2f} s "
                  f"after the kill, re-planned and restarted on the survivor in {rec.get('recovery_s', 0):.1f} s, "
                  f"{rec.get('in_flight')} requests in flight resumed; completed {fault['completed']}, lost "
                  f"{fault['lost']}, tokens identical {fault['tokens_identical']} (load "
                  f"{' '.join(f'{x:.1f}' for x in fault['load_avg'])})."]
    lines += ["", f"{SLOTS} slots in {MICROBATCHES} groups (async) or one group (sync), prompts 4-16 tokens prefilled "
              f"in chunks of {CHUNK} (a longer prompt over two iterations, beside other requests' decodes), outputs "
              f"{SHORT[0]}-{SHORT[1]}, Poisson 200 requests/s (saturating). 2 cores shared with other engineers' jobs (load average "
              "beside each row, and per run in the JSON); OMP_NUM_THREADS=1, one intra-op thread per worker. "
              "Figures: the median run of each schedule, the schedules interleaved on one cluster "
              "(A B, B A, ...); paired mean ≥ bound: the geometric mean of each repeat's async/sync and its "
              "one-sided 90% lower confidence bound. "
              "Predicted: the serving model's period, the expectation of max(m·T, L + control) over the run's "
              "spread from iteration to iteration (max(m·T, L + control) itself for sync), over kernel times taken "
              "from the same median run's worker events (per-kernel means, each device's time outside kernels per "
              "kernel, the driver's round trip, the spreads of each device's step and of the round trip) and the "
              "gloo link probed at start-up at the latency the run's transfers met; "
              "simulated: tessera.sim on a mixed-phase Plan priced by the same costs, same workload and seed, under "
              "the run's own admission (its slots, each refilled by the next arrival as soon as it frees; a "
              "request prefills one chunk per iteration). Workers run every queued step at once, oldest first, "
              "kernel by kernel as data arrives (one group computes while another's step waits on a transfer). "
              "2nd process slowdown: a decode-shaped 46 MB GEMV and a 256² GEMM timed in one process, then in two "
              "at once, just before the row (1.0x: the second core is free, and the asynchronous schedule can fill "
              "the idle time the synchronous one leaves on a worker; 2.0x: the two workers share one core's worth, "
              "a worker idle in the synchronous schedule only speeds the other up, and there is nothing to fill); "
              "niced jobs: the share of both cores' time /proc/stat counted for niced processes (other jobs at "
              "lower priority) while the two processes ran. "
              "Profile-only: the same two predictions from the single-process CPU profile instead (independent "
              "of the run, taken at another moment's load)."]
    return "\n".join(lines) + "\n\n" + time_table(rows)


def render(rows: list[dict[str, Any]], fault: dict[str, Any], sweep: list[dict[str, Any]]) -> str:
    text = table(rows, fault)
    if sweep:
        order = sorted(sweep, key=lambda r: (r["model"], r["placement"], r.get("outputs", SHORT)[0],
                                             r["slots"], r["microbatches"]))
        text += "\n" + sweep_table(order)
    return text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="16 requests, llama-tiny only, 1 repeat; printed only")
    ap.add_argument("--render", action="store_true",
                    help="rewrite serve_runtime.md from serve_runtime.json (no run; the tables' layout only)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--sweep-models", default="llama-wide",
                    help="models also served one request per group (2 slots in 2 groups, 4 in 4, and 2 in 2 "
                         f"with outputs of {LONG[0]}-{LONG[1]} tokens); '' for none")
    ap.add_argument("--long-requests", type=int, default=32,
                    help=f"requests of the sweep rows with outputs of {LONG[0]}-{LONG[1]} tokens")
    a = ap.parse_args()
    if a.render:
        saved = json.loads((OUT / "serve_runtime.json").read_text())
        text = render(saved["rows"], saved["fault"], saved["sweep"])
        (OUT / "serve_runtime.md").write_text(text + "\n")
        print(text)
        return
    n, repeats = (16, 1) if a.quick else (a.requests, a.repeats)
    models = MODELS[:1] if a.quick else tuple(a.models.split(","))
    rows = [row(m, p, n, repeats) for m in models for p in PLACEMENTS]
    sweep_models = () if a.quick else tuple(x for x in a.sweep_models.split(",") if x)
    sweep = [row(m, p, n, repeats, slots=k, microbatches=k)
             for m in sweep_models for p in PLACEMENTS for k in (2, 4)]
    sweep += [row(m, p, a.long_requests, repeats, slots=2, microbatches=2, outputs=LONG)
              for m in sweep_models for p in PLACEMENTS]
    sweep += [r for r in rows if r["model"] in sweep_models]
    kill_at = min(20, n - 1)
    fault = row("llama-tiny", "layer_split", n, 1, Fault(at_request=kill_at, rank=1)) | {"kill_at": kill_at}
    if a.quick:  # a smoke run: printed, not recorded
        print(table(rows, fault))
        return
    OUT.mkdir(exist_ok=True)
    text = render(rows, fault, sweep)
    (OUT / "serve_runtime.json").write_text(json.dumps({"rows": rows, "fault": fault, "sweep": sweep}, indent=1))
    (OUT / "serve_runtime.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
