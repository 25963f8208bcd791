"""Prepared GPU check of the engine's CUDA path: one command on a machine with one or more NVIDIA GPUs.

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 bench/gpu/engine_cuda_check.py            # a few minutes
    PYTHONPATH=. python3 bench/gpu/engine_cuda_check.py --dry-run-cpu                 # the same cases on CPU

Each case runs in a child process with a time limit (``--timeout`` seconds) and its result is appended to
``$OUT/engine_cuda.jsonl`` (else bench/results/) as soon as it finishes; the summary goes to
``engine_cuda.json`` beside it. Workers rendezvous on a free port (tessera.runtime.cluster.free_port).
Exits 2 at once without a GPU (unless --dry-run-cpu), 1 if a case fails.

Imports: torch, numpy, safetensors and rich (the engine's own); never highspy or the plan stage (the
placements here are fixed: no solver), and transformers only if present (the zoo's configs go through
it; without it the tiny Llama is built from its dimensions, the 0.5B serving case is skipped). A missing
module is reported as the case's error, not a crash.

Cases (``cuda:0`` etc.; ``--dry-run-cpu``: ``cpu`` workers, gloo, the ordered schedule on tag 0):
- ``one_worker``: the whole tiny Llama on one CUDA worker (NCCL, world 1, the ordered schedule) with
  decode iterations as CUDA graphs, against the same worker without graphs: logits bit-identical, every
  iteration; graphs captured and replayed; greedy tokens beside the CPU engine's (reported only).
- ``two_workers_one_gpu``: two workers sharing cuda:0 over gloo, transfers staged through pinned host
  memory, two groups in flight: logits bit-identical to ``one_worker``'s.
- ``two_gpus_nccl`` (two GPUs or more): workers on cuda:0 and cuda:1 over NCCL point-to-point, the
  ordered schedule, CUDA graphs: tokens identical to ``one_worker``'s.
- ``qwen05_serving``: Qwen2.5-0.5B's published config, dummy bf16 weights, the 64-request workload
  (bench/workloads/qwen05_64.json) on one GPU worker: throughput, TTFT, TPOT, host time per iteration.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
NEEDED = ("torch", "numpy", "safetensors", "rich")
CASES = ("one_worker", "two_workers_one_gpu", "two_gpus_nccl", "qwen05_serving")
PROMPTS = [[5, 6, 7], list(range(10, 23)), [40] * 9, list(range(60, 90))]


def missing() -> list[str]:
    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


def tiny_arch() -> Any:
    """llama-tiny's dimensions: from the zoo where transformers is installed, else written out."""
    from tessera.engine.arch import ModelArch

    if importlib.util.find_spec("transformers") is not None:
        from tessera.engine.loader import open_model

        return open_model("llama-tiny")
    from tessera.engine.loader import ModelSource

    inv = tuple(1.0 / 10000.0 ** (i / 16) for i in range(0, 16, 2))
    arch = ModelArch(model_type="llama", family="decoder", vocab_size=256, hidden_size=64, num_layers=2,
                     norm_eps=1e-6, tie_word_embeddings=False, context_window=4096, num_heads=4,
                     num_kv_heads=2, head_dim=16, intermediate_size=128, windows=(0, 0), inv_freq=inv)
    return ModelSource(name="llama-tiny-dims", arch=arch)


def serve_once(source: Any, kinds: tuple, assignment: tuple[int, ...], *, m: int, settings: Any,
               dtype: Any = None) -> dict[str, Any]:
    """The prompts served on workers: tokens, every iteration's logits (host), graph counts, seconds."""
    import torch

    from tessera.engine.config import EngineConfig, SamplingParams
    from tessera.engine.engine import Engine
    from tessera.engine.routes import Placement
    from tessera.engine.serve import Arrival, WorkerPool, drive
    from tessera.engine.tokenizer import ByteTokenizer

    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=16, page_size=16, max_model_len=64,
                          microbatches=m)
    engine = Engine(None, source, config, ByteTokenizer(eos_token_ids=()), keep_logits=True)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    placed = Placement(assignment=assignment, label="check")
    t0 = time.monotonic()
    with WorkerPool(source, dtype or torch.float32, config, kinds, lambda _k: placed, load_format="dummy",
                    seed=0, settings=settings) as pool:
        reqs, _, log = drive(engine, pool, [Arrival(arrival_s=0.0, prompt_ids=tuple(p), params=params)
                                            for p in PROMPTS])
    return {"tokens": [r.output_ids for r in reqs], "iterations": len(log.host_s),
            "history": [(h.group, h.tokens, h.logits) for h in engine.history],
            "wall_s": time.monotonic() - t0}


def same_logits(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same iterations per group, each with bit-identical logits (compared where the schedule is the
    same in both runs: one group, or groups whose admissions fell alike)."""
    import torch

    def by_group(run: dict[str, Any]) -> dict[int, list[tuple[Any, Any]]]:
        out: dict[int, list[tuple[Any, Any]]] = {}
        for g, t, x in run["history"]:
            out.setdefault(g, []).append((t, x))
        return out

    ga, gb = by_group(a), by_group(b)
    return ga.keys() == gb.keys() and all(
        [t for t, _ in ga[g]] == [t for t, _ in gb[g]]
        and all(torch.equal(xa, xb) for (_, xa), (_, xb) in zip(ga[g], gb[g], strict=True)) for g in ga)


def case(name: str, dry: bool) -> dict[str, Any]:
    import torch

    from tessera.engine.cluster import ClusterSettings
    from tessera.engine.devices import WorkerKind
    from tessera.engine.program import Program

    source = tiny_arch()
    with torch.device("meta"):
        from tessera.engine.models import construct

        n = len(Program(construct(source.arch, torch.float32)).kernels)
    dev = "cpu" if dry else "cuda:0"
    ordered = ClusterSettings(ordered=True) if dry else ClusterSettings()
    if name == "one_worker":
        graphs = serve_once(source, (WorkerKind(device=dev),), (0,) * n, m=1, settings=ordered)
        eager = serve_once(source, (WorkerKind(device=dev),), (0,) * n, m=1,
                           settings=ClusterSettings(ordered=True, cuda_graphs=False))
        return {"ok": same_logits(eager, graphs) and graphs["tokens"] == eager["tokens"],
                "tokens": graphs["tokens"], "iterations": graphs["iterations"], "wall_s": graphs["wall_s"]}
    base = serve_once(source, (WorkerKind(device=dev),), (0,) * n, m=1, settings=ordered)
    half = tuple(int(i >= n // 2) for i in range(n))
    if name == "two_workers_one_gpu":  # one group: the same iterations, bit for bit; two: the same tokens
        staged = ClusterSettings(transport="gloo")
        one = serve_once(source, (WorkerKind(device=dev),) * 2, half, m=1, settings=staged)
        two = serve_once(source, (WorkerKind(device=dev),) * 2, half, m=2, settings=staged)
        return {"ok": same_logits(base, one) and one["tokens"] == two["tokens"] == base["tokens"],
                "tokens": two["tokens"], "wall_s": two["wall_s"]}
    if name == "two_gpus_nccl":
        if not dry and torch.cuda.device_count() < 2:
            return {"ok": True, "skipped": f"{torch.cuda.device_count()} GPU: NCCL point-to-point needs two"}
        devs = ("cpu", "cpu") if dry else ("cuda:0", "cuda:1")
        got = serve_once(source, tuple(WorkerKind(device=d) for d in devs), half, m=2, settings=ordered)
        return {"ok": got["tokens"] == base["tokens"], "tokens": got["tokens"], "wall_s": got["wall_s"]}
    return qwen05(dev, dry)


def qwen05(dev: str, dry: bool) -> dict[str, Any]:
    """The 64-request workload on one worker (GPU: the whole file; dry run: its first 4 requests)."""
    if importlib.util.find_spec("transformers") is None:
        return {"ok": True, "skipped": "transformers not installed: Qwen2.5-0.5B's config cannot be read"}
    import torch

    from tessera.engine.cluster import ClusterSettings
    from tessera.engine.config import EngineConfig
    from tessera.engine.devices import WorkerKind
    from tessera.engine.engine import Engine
    from tessera.engine.loader import open_model
    from tessera.engine.routes import Placement
    from tessera.engine.serve import WorkerPool, drive
    from tessera.engine.serve_run import file_stream
    from tessera.engine.tokenizer import ByteTokenizer

    source = open_model(str(ROOT / "bench" / "workloads" / "qwen2.5-0.5b"))
    stream = file_stream(ROOT / "bench" / "workloads" / "qwen05_64.json", source.arch.vocab_size)
    arrivals = stream.arrivals[:4] if dry else stream.arrivals
    if dry:
        arrivals = tuple(a.__class__(arrival_s=0.0, prompt_ids=a.prompt_ids[:8], params=a.params.__class__(
            max_tokens=2, ignore_eos=True)) for a in arrivals)
    config = EngineConfig(max_num_seqs=32, max_num_batched_tokens=512, page_size=16, max_model_len=384,
                          microbatches=1)
    from tessera.engine.models import construct
    from tessera.engine.program import Program

    with torch.device("meta"):
        nodes = len(Program(construct(source.arch, torch.bfloat16)).kernels)
    engine = Engine(None, source, config, ByteTokenizer(eos_token_ids=()))
    t0 = time.monotonic()
    with WorkerPool(source, torch.bfloat16, config, (WorkerKind(device=dev),),
                    lambda _k: Placement(assignment=(0,) * nodes, label="one worker"), load_format="dummy",
                    seed=0, settings=ClusterSettings()) as pool:
        start_s = time.monotonic() - t0
        reqs, timing, log = drive(engine, pool, arrivals)
    done = [r for r in reqs if r.finished]
    span = max(t.finish_s for t in timing.values()) - min(t.arrival_s for t in timing.values())
    tokens = sum(len(r.output_ids) for r in done)
    ttft = sorted(timing[r.id].first_s - timing[r.id].arrival_s for r in done)
    tpot = sorted((timing[r.id].finish_s - timing[r.id].first_s) / (len(r.output_ids) - 1) for r in done
                  if len(r.output_ids) > 1)
    host = sorted(log.host_s)

    def pct(xs: list[float], q: float) -> float | None:
        return xs[max(0, math.ceil(q * len(xs)) - 1)] if xs else None

    return {"ok": len(done) == len(arrivals), "requests": len(arrivals),
            "throughput_tokens_per_s": tokens / span,
            "ttft_s": {"p50": pct(ttft, 0.5), "p99": pct(ttft, 0.99)},
            "tpot_s": {"p50": pct(tpot, 0.5), "p99": pct(tpot, 0.99)},
            "host_ms_per_iteration": {"p50": pct([h * 1e3 for h in host], 0.5),
                                      "p99": pct([h * 1e3 for h in host], 0.99)},
            "iterations": len(log.host_s), "start_s": start_s}


def child(name: str, dry: bool) -> None:
    """One case in this process; its result as the last stdout line."""
    gone = missing()
    try:
        if gone:
            raise ImportError(f"missing module(s): {', '.join(gone)}")
        out = case(name, dry)
    except Exception as e:  # noqa: BLE001 - the case's result says what went wrong
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    print("RESULT " + json.dumps(out, default=str), flush=True)


def run_case(name: str, dry: bool, timeout_s: float) -> dict[str, Any]:
    t0 = time.monotonic()
    cmd = [sys.executable, __file__, "--case", name] + (["--dry-run-cpu"] if dry else [])
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        line = next((x for x in reversed(r.stdout.splitlines()) if x.startswith("RESULT ")), None)
        out = json.loads(line[7:]) if line else {"ok": False, "error": f"exit {r.returncode}",
                                                  "stderr": r.stderr[-3000:]}
    except subprocess.TimeoutExpired:
        out = {"ok": False, "error": f"timed out after {timeout_s:g} s"}
    return {"case": name, **out, "case_s": round(time.monotonic() - t0, 1)}


def environment(dry: bool) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0], "missing": missing(),
                           "transformers": importlib.util.find_spec("transformers") is not None,
                           "highspy": importlib.util.find_spec("highspy") is not None}
    if not dry:
        env |= {"cuda": torch.version.cuda, "gpus": [torch.cuda.get_device_name(i)
                                                    for i in range(torch.cuda.device_count())]}
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:  # noqa: BLE001 - recorded, not fatal
            env["nccl"] = f"unavailable: {e}"
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run-cpu", action="store_true", help="the cases on cpu workers (no GPU needed)")
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per case")
    ap.add_argument("--only", nargs="*", choices=CASES, help="run these cases only")
    args = ap.parse_args()
    if args.case:
        child(args.case, args.dry_run_cpu)
        return
    import torch

    if not args.dry_run_cpu and not torch.cuda.is_available():
        print(f"engine_cuda_check: no CUDA GPU visible (torch {torch.__version__}); use --dry-run-cpu",
              file=sys.stderr)
        sys.exit(2)
    folder = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "bench" / "results"
    folder.mkdir(parents=True, exist_ok=True)
    stem = "engine_cuda_dry" if args.dry_run_cpu else "engine_cuda"
    lines = folder / f"{stem}.jsonl"
    lines.write_text("")
    results = []
    for name in args.only or CASES:
        got = run_case(name, args.dry_run_cpu, args.timeout)
        results.append(got)
        with lines.open("a") as f:
            f.write(json.dumps(got, default=str) + "\n")
        shown = {k: v for k, v in got.items() if k not in ("traceback", "history")}
        print(f"[{'ok' if got['ok'] else 'FAIL'}] {name}: " + json.dumps(shown, default=str)[:600])
    summary = {"check": "engine CUDA path", "dry_run_cpu": args.dry_run_cpu,
               "environment": environment(args.dry_run_cpu), "ok": all(r["ok"] for r in results),
               "cases": results}
    (folder / f"{stem}.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"engine_cuda_check: {'PASSED' if summary['ok'] else 'FAILED'}; wrote {lines} and {stem}.json")
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
