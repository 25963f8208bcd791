"""The planner-made split of the engine over two CPU workers of different speeds, against one worker.

Workers: ``cpu`` (one thread) and ``cpu:speed=0.5`` (one thread, a 50% duty cycle: a device half as fast on
a core of its own; docs/engine.md says why not thread counts on a 2-core machine). The split needs both
cores: run it when no other job holds one (the load column says what it met). The kinds are profiled
first (``tessera.engine.profile``: every node timed in a worker of each kind at the serving model's
iteration shapes, fresh, not from the cache; for the split both kinds at once, as they will compute) and
the link measured as an iteration meets it; tessera.plan then places llama-wide's
kernels (fp32, 183 MB) over the two workers and over the fast one alone, at the same engine settings
(8 sequences, 2 micro-batch groups, 64 tokens per iteration), and writes both Plan files. Each plan is
served, ``--repeats`` times in alternating order, by ``tessera serve-run``'s function on an offline
stream of 64 requests (prompts and outputs of 32-64 tokens, seeded), the first run of each verified
against the single-process engine; tessera.sim serves the same workload on each Plan file. Last, the
split again with worker 1 SIGKILLed when request 20 is first scheduled (recovered onto worker 0).

Figures: measured output tokens/s (first arrival to last completion, median of the repeats), the planner's
(the Plan's throughput: the knee's capacity) and the simulator's, their errors against measured, the
split's speedup, each run's load average, the workers' busy shares and node counts.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_engine_split.py [--repeats 3] [--quick]
(``--quick``: llama-tiny, 16 requests, nothing written). Writes bench/results/engine_split.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from tessera.engine.config import EngineConfig
from tessera.engine.devices import WorkerKind
from tessera.engine.loader import open_model
from tessera.engine.placement import plan_engine
from tessera.engine.profile import ProfileCost, measure_link, profile_kinds
from tessera.engine.serve import Fault
from tessera.engine.serve_run import ServeRunSpec, serve_run
from tessera.plan import Traffic
from tessera.sim.workload import LengthSpec, WorkloadSpec

OUT = Path(__file__).parent / "results"
# A device and one half as fast, one thread each on this 2-core machine (docs/engine.md: a duty cycle
# rather than thread counts): the split needs both cores, so it runs when other jobs leave them free
# (the load column).
FAST, SLOW = WorkerKind(device="cpu"), WorkerKind(device="cpu", speed=0.5)
KILL_AT = 20  # the request at whose first iteration worker 1 is SIGKILLed in the fault row


def setup(quick: bool, seqs: int, groups: int, budget: int, prompt: str, output: str
          ) -> tuple[str, EngineConfig, WorkloadSpec]:
    if quick:
        config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=32, page_size=16, max_model_len=64,
                              microbatches=2)
        return "llama-tiny", config, WorkloadSpec(kind="offline", requests=16, prompt=LengthSpec(lo=8, hi=16),
                                                  output=LengthSpec(lo=8, hi=16))
    w = WorkloadSpec(kind="offline", requests=64, prompt=LengthSpec.parse(prompt), output=LengthSpec.parse(output))
    config = EngineConfig(max_num_seqs=seqs, max_num_batched_tokens=budget, page_size=16,
                          max_model_len=w.prompt.hi + w.output.hi, microbatches=groups)
    return "llama-wide", config, w


def plans(model: str, config: EngineConfig, w: WorkloadSpec, folder: Path) -> dict[str, object]:
    """Profiles (fresh: the fast kind alone for one worker; both kinds computing together for the split, as
    they will) and the link, then the planner's Plan for each configuration."""
    source = open_model(model)
    traffic = Traffic(prompt=(w.prompt.lo + w.prompt.hi) // 2, output=(w.output.lo + w.output.hi) // 2)
    context = traffic.prompt + traffic.output // 2
    link = measure_link(source, torch.float32, config, cached=False)
    out: dict[str, object] = {"link": asdict(link)}
    for name, kinds in (("single", (FAST,)), ("split", (FAST, SLOW))):
        t0 = time.monotonic()
        profiles = profile_kinds(source, torch.float32, config, kinds, context=context, cached=False)
        profile_s = time.monotonic() - t0
        cost = ProfileCost(profiles)
        placed = plan_engine(source, torch.float32, config, kinds, traffic, cost, link.spec())
        path = folder / f"engine_{name}_plan.json"
        placed.plan.save(path)
        out[name] = {"path": str(path), "kinds": [k.name for k in kinds], "profile_s": profile_s,
                     "plan_s": time.monotonic() - t0 - profile_s,
                     "predicted": placed.plan.throughput_tokens_per_s, "notes": placed.plan.notes,
                     "nodes": [placed.assignment.count(d) for d in range(len(kinds))],
                     "device_busy": placed.plan.device_busy,
                     "profiles": {k: {"iteration_s": p.iteration_s, "shapes": p.shapes}
                                  for k, p in profiles.items()}}
    return out


def serve(model: str, config: EngineConfig, w: WorkloadSpec, kinds: tuple[WorkerKind, ...], plan_path: str,
          verify: bool, fault: Fault | None = None) -> dict[str, object]:
    spec = ServeRunSpec(model=model, kinds=kinds, placement=plan_path, workload=w, config=config,
                        dtype="fp32", load_format="dummy", seed=0, verify=verify, recover=fault is not None,
                        fault=fault)
    r = serve_run(spec)
    e = r.extra
    return {"throughput": r.throughput_tokens_per_s, "planner": r.predicted_throughput_tokens_per_s,
            "simulator": r.simulated_throughput_tokens_per_s, "verified": r.verified,
            "completed": r.completed, "lost": r.lost, "ttft_s": r.ttft_s, "tpot_s": r.tpot_s,
            "host_ms": r.host_ms_per_iteration, "busy_share": e["worker_busy_share"],
            "load_avg": [e["load_avg_before"][0], e["load_avg_after"][0]], "iterations": e["iterations"],
            "recoveries": e["recoveries"], "start_s": e["start_s"]}


def summary(runs: list[dict[str, object]]) -> dict[str, object]:
    med = statistics.median(r["throughput"] for r in runs)
    planner, sim = runs[0]["planner"], runs[0]["simulator"]
    return {"measured": med, "runs": [r["throughput"] for r in runs], "planner": planner, "simulator": sim,
            "planner_error": planner / med - 1, "simulator_error": sim / med - 1}


def row(name: str, doc: dict[str, object]) -> str:
    s, p, runs = doc["summary"][name], doc["plans"][name], doc["runs"][name]
    measured = ", ".join(f"{x:.1f}" for x in s["runs"])
    loads = ", ".join(str(round(r["load_avg"][0], 2)) for r in runs)
    return (f"| {name} ({', '.join(p['kinds'])}) | {p['nodes']} | {s['measured']:.1f} ({measured}) | "
            f"{s['planner']:.1f} | {s['simulator']:.1f} | {s['planner_error']:+.1%} | "
            f"{s['simulator_error']:+.1%} | {[round(x, 2) for x in runs[0]['busy_share']]} | {loads} |")


def markdown(doc: dict[str, object]) -> str:
    m, f, link = doc["meta"], doc["fault"], doc["plans"]["link"]
    recovery = f["recoveries"][0] if f["recoveries"] else "no recovery"
    return "\n".join([
        f"# The engine split over two CPU workers of different speeds ({m['model']}, {m['dtype']})", "",
        f"Workers `{FAST.name}` and `{SLOW.name}` (one thread each, the second a 50% duty cycle: speeds 2:1; "
        f"OMP_NUM_THREADS={m['omp']}), {m['cpu']}; "
        f"engine {m['engine']}; offline stream of {m['workload']}; {m['repeats']} runs per configuration in "
        f"alternating order, medians; load average {m['load_start']} at the start and {m['load_end']} at "
        f"the end (2 cores, shared with other engineers' jobs). The link as an iteration met it: "
        f"{link['latency_s'] * 1e3:.2f} ms per crossing (start-up probe "
        f"{link['probe_latency_s'] * 1e3:.2f} ms). "
        f"Measured by `OMP_NUM_THREADS=1 .venv/bin/python bench/bench_engine_split.py`.", "",
        "| configuration | nodes per worker | measured tokens/s (runs) | planner | simulator | planner "
        "error | simulator error | busy share | load avg per run |", "|---|---|---|---|---|---|---|---|---|",
        row("single", doc), row("split", doc), "",
        f"Split over single, measured: **{doc['speedup']:.2f}x** (planner {doc['planner_speedup']:.2f}x, "
        f"simulator {doc['simulator_speedup']:.2f}x); the planner's choice: "
        f"{'; '.join(doc['plans']['split']['notes'])}. Every first run verified against the single-process "
        f"engine: {doc['verified']}.", "",
        f"Fault: worker 1 SIGKILLed when request {KILL_AT} was first scheduled: {f['completed']} of "
        f"{m['requests']} completed, lost {f['lost']}, tokens equal to the single-process engine's: "
        f"{f['verified']}; {recovery}.", "",
        "Reading: the planner's figure is the Plan's throughput (the serving model's capacity from the "
        "profiled kernel costs); the simulator serves the same requests on that Plan file. Both price each "
        "kind by its own profile, taken just before the runs; on a shared 2-core machine a run that meets "
        "another load than its profile did runs slower or faster than predicted (the load column)."]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seqs", type=int, default=12, help="max_num_seqs")
    ap.add_argument("--groups", type=int, default=3, help="micro-batch groups (iterations in flight)")
    ap.add_argument("--budget", type=int, default=64, help="max_num_batched_tokens")
    ap.add_argument("--prompt", default="32-64", help="prompt tokens, LO-HI")
    ap.add_argument("--output", default="32-64", help="output tokens, LO-HI")
    args = ap.parse_args()
    model, config, w = setup(args.quick, args.seqs, args.groups, args.budget, args.prompt, args.output)
    load_start = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TESSERA_PROFILE_DIR"] = tmp
        folder = Path(tmp) if args.quick else OUT
        made = plans(model, config, w, folder)
        runs: dict[str, list[dict[str, object]]] = {"single": [], "split": []}
        order = [("single", (FAST,)), ("split", (FAST, SLOW))]
        for rep in range(args.repeats):
            for name, kinds in (order if rep % 2 == 0 else order[::-1]):
                runs[name].append(serve(model, config, w, kinds, made[name]["path"], verify=rep == 0))
                print(name, rep, round(runs[name][-1]["throughput"], 1), flush=True)
        fault = serve(model, config, w, (FAST, SLOW), made["split"]["path"], verify=True,
                      fault=Fault(at_request=KILL_AT if not args.quick else 4, rank=1))
    sums = {name: summary(rs) for name, rs in runs.items()}
    doc = {"meta": {"model": model, "dtype": "float32", "engine": asdict(config),
                    "omp": os.environ.get("OMP_NUM_THREADS"), "requests": w.requests, "repeats": args.repeats,
                    "workload": f"{w.requests} requests, prompts {w.prompt}, outputs {w.output}",
                    "load_start": load_start, "load_end": round(os.getloadavg()[0], 2),
                    "cpu": "AMD EPYC, 2 vCPU", "threads": torch.get_num_threads()},
           "plans": made, "runs": runs, "summary": sums, "fault": fault,
           "speedup": sums["split"]["measured"] / sums["single"]["measured"],
           "planner_speedup": sums["split"]["planner"] / sums["single"]["planner"],
           "simulator_speedup": sums["split"]["simulator"] / sums["single"]["simulator"],
           "verified": all(rs[0]["verified"] for rs in runs.values())}
    text = markdown(doc)
    print(text)
    if not args.quick:
        OUT.mkdir(exist_ok=True)
        for name in ("single", "split"):  # the Plan files stay beside the results, for tessera simulate
            made[name]["path"] = str(Path(made[name]["path"]).relative_to(OUT.parent.parent))
        (OUT / "engine_split.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
        (OUT / "engine_split.md").write_text(text)


if __name__ == "__main__":
    main()
