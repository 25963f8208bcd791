"""Prepared GPU check of the runtime's CUDA path: one command on a machine with one NVIDIA GPU.

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 bench/gpu/runtime_cuda_check.py        # about 2-4 minutes

Writes runtime_cuda.json to $OUT (when set) and to bench/results/. Exits 2 at once if no GPU is visible,
1 if any check fails. Needs torch with CUDA and transformers (llama-tiny is captured there; or pass
``--programs FILE`` made beforehand on any machine with ``--save-programs FILE``); highspy is optional
(only the end-to-end ``api.run`` case, whose prediction uses tessera.plan, needs it).

Why two workers share cuda:0 over gloo, not NCCL: NCCL refuses two ranks of one communicator on one GPU
("Duplicate GPU detected", ncclInvalidUsage; e.g. NVIDIA/Megatron-LM#661), and gloo has no CUDA
point-to-point, so ``--transport auto`` runs workers that share a GPU on gloo with every transfer staged
through host memory (PartitionWorker.outgoing / landed). The check records NCCL's answer to a duplicate GPU
(``nccl_duplicate_gpu``) so the choice stays grounded. NCCL itself runs here with one worker (world 1:
device placement, eager init, the ordered schedule, event timing; no point-to-point). NCCL
point-to-point between distinct GPUs needs two GPUs; its issue order is checked without a GPU (the
ordered schedule on tag-free gloo, tests/runtime/test_ordered.py) and here on CUDA workers over gloo.

Pass criterion: outputs bit-identical to single-process execution on the same GPU (same kernels, same
inputs, same device: any difference is a runtime bug). CUDA vs the CPU reference is reported only
(different kernels; greedy tokens are compared, values are not).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tessera.runtime.cluster import Cluster, ClusterConfig  # noqa: E402
from tessera.runtime.device import HOST  # noqa: E402
from tessera.runtime.placements import all_on, attention_gemm, layer_split  # noqa: E402
from tessera.runtime.recovery import phase_graphs  # noqa: E402
from tessera.runtime.runner import ClusterExecutor, build_partitions, compare, run_round  # noqa: E402
from tessera.runtime.steps import Job, LocalExecutor, capture_steps  # noqa: E402

JOB = Job(model="llama-tiny", seq=8, new_tokens=4)
GPU = torch.device("cuda", 0)


def die_without_gpu() -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        print(f"runtime_cuda_check: FAILED: no CUDA GPU visible (torch {torch.__version__}, "
              f"torch.cuda.is_available()={torch.cuda.is_available()}); this check needs one", file=sys.stderr)
        sys.exit(2)


def environment() -> dict[str, Any]:
    nccl = None
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        nccl = f"unavailable: {e}"
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
            "gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "python": sys.version.split()[0]}


def check_cluster(name: str, programs: dict, plans: dict, devices: tuple[str, ...], m: int, want: Any,
                  **cfg: Any) -> dict[str, Any]:
    """Run one round per plan on workers; compare with the single-process round ``want`` on the same device."""
    t0 = time.monotonic()
    out: dict[str, Any] = {"case": name, "devices": list(devices), "microbatches": m}
    try:
        n = len(devices)
        parts = build_partitions(programs, plans, n)
        config = ClusterConfig(devices=devices, max_microbatches=m, heartbeat_timeout_s=10.0, **cfg)
        out |= {"backend": config.backend, "ordered": config.ordered_issue}
        per_plan = {}
        with Cluster(programs, parts, config) as cluster:
            for plan in plans:
                got = run_round(ClusterExecutor(cluster), JOB, programs, plan, m, 0)
                same, diff, tokens = compare([got], [want])
                per_plan[plan] = {"bit_identical": same, "max_abs_diff": diff, "tokens_identical": tokens,
                                  "link_bytes": sum(sum(p.link_bytes().values()) for (k, pl), p in parts.items()
                                                    if pl == plan)}
            spans = [(k[2], k[3], w["start_s"], w["end_s"]) for h in cluster.history for w in h["workers"]
                     for k in w["kernels"]]  # event times mapped onto the host clock fall inside their step
            out["kernel_times_inside_steps"] = all(s0 - 1e-3 <= a <= b <= s1 + 1e-3 for a, b, s0, s1 in spans)
        out["plans"] = per_plan
        out["ok"] = all(p["bit_identical"] and p["tokens_identical"] for p in per_plan.values()) and \
            out["kernel_times_inside_steps"]
    except Exception as e:  # noqa: BLE001 - one failed case must not hide the others
        out |= {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    out["wall_s"] = round(time.monotonic() - t0, 2)
    print(f"[{'ok' if out['ok'] else 'FAIL'}] {name}: {json.dumps({k: v for k, v in out.items() if k != 'traceback'})}")
    return out


def nccl_duplicate_probe(timeout_s: float = 90.0) -> dict[str, Any]:
    """Two processes, one NCCL communicator, both on cuda:0: NCCL's answer, in a child with a time limit."""
    code = ("import os, torch, torch.distributed as dist, torch.multiprocessing as mp\n"
            "def f(r):\n"
            "    torch.cuda.set_device(0)\n"
            "    dist.init_process_group('nccl', rank=r, world_size=2, device_id=torch.device('cuda', 0))\n"
            "    t = torch.full((4,), float(r), device='cuda:0')\n"
            "    (dist.send if r == 0 else dist.recv)(t, 1 - r)\n"
            "    torch.cuda.synchronize(); print('rank', r, 'got', t.tolist(), flush=True)\n"
            "    dist.destroy_process_group()\n"
            "if __name__ == '__main__':\n"
            "    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='29531')\n"
            "    mp.start_processes(f, nprocs=2, start_method='spawn')\n")
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                           env={**os.environ, "NCCL_DEBUG": "WARN"})
        text = r.stdout + r.stderr
        dup = "Duplicate GPU" in text
        return {"returncode": r.returncode, "duplicate_gpu_refused": dup, "wall_s": round(time.monotonic() - t0, 1),
                "tail": "\n".join(line for line in text.splitlines() if "Duplicate" in line or "rank" in line)[-1500:]}
    except subprocess.TimeoutExpired:
        return {"returncode": None, "duplicate_gpu_refused": None, "note": f"no answer within {timeout_s:g} s"}


def end_to_end() -> dict[str, Any]:
    """`tessera run llama-tiny --devices cuda:0,cuda:0 --verify` as a function (needs highspy)."""
    try:
        import highspy  # noqa: F401
    except ImportError:
        return {"skipped": "highspy not installed (tessera.plan scores the prediction)"}
    from tessera.runtime.api import RunSpec, run

    programs = capture_steps(JOB)
    plan = {ph: layer_split(g, 2) for ph, g in phase_graphs(programs).items()}
    try:
        out = run(RunSpec(job=JOB, devices=("cuda:0", "cuda:0"), plans={"latency": plan, "throughput": plan},
                          microbatches=2, requests=3), programs).to_dict()
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    keys = ("devices", "microbatches", "verified", "max_abs_diff", "tokens_identical", "measured_step_s",
            "predicted_step_s", "throughput_tokens_per_s", "link_bytes", "transport", "overlap", "switches")
    return {"ok": bool(out["verified"]), **{k: out[k] for k in keys}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--programs", help="torch.save'd programs (from --save-programs) instead of capturing here")
    ap.add_argument("--save-programs", help="capture llama-tiny, save the programs here, and exit (no GPU needed)")
    ap.add_argument("--skip-nccl-probe", action="store_true")
    ap.add_argument("--dry-run-cpu", action="store_true", help="the same cases on cpu workers (checks this "
                    "script without a GPU; results are not written)")
    args = ap.parse_args()
    if args.save_programs:
        torch.save(capture_steps(JOB), args.save_programs)
        print(f"saved {args.save_programs}")
        return
    dry = args.dry_run_cpu
    if not dry:
        die_without_gpu()
    dev, name = (HOST, "cpu") if dry else (GPU, "cuda:0")
    t_all = time.monotonic()
    result: dict[str, Any] = {"check": "runtime CUDA path", "job": asdict(JOB),
                              "environment": {"torch": torch.__version__} if dry else environment()}
    print(json.dumps(result["environment"]))
    programs = torch.load(args.programs, weights_only=False) if args.programs else capture_steps(JOB)
    graphs = phase_graphs(programs)
    plans = {"attention_gemm": {ph: attention_gemm(g, 2) for ph, g in graphs.items()},
             "layer_split": {ph: layer_split(g, 2) for ph, g in graphs.items()}}
    one = {"all_on_0": {ph: all_on(g) for ph, g in graphs.items()}}
    torch.set_num_threads(1)
    want = run_round(LocalExecutor(programs, dev), JOB, programs, "reference", 2, 0)
    host = run_round(LocalExecutor(programs, HOST), JOB, programs, "reference", 2, 0)
    same, diff, tokens = compare([want], [host])
    result["cuda_vs_cpu_single_process"] = {"bit_identical": same, "max_abs_diff": diff, "tokens_identical": tokens,
                                            "note": "reported only: different kernels on different hardware"}
    print("cuda vs cpu (single process):", result["cuda_vs_cpu_single_process"])
    cases = [
        check_cluster("one_worker_nccl_world_1", programs, one, (name,), 2, want, ordered=True),
        check_cluster("two_workers_share_the_gpu_gloo_staged", programs, plans, (name, name), 2, want),
        check_cluster("two_workers_gloo_staged_nccl_issue_order", programs, plans, (name, name), 2, want,
                      ordered=True),
    ]
    result["cases"] = cases
    if dry:
        print("dry run:", "PASSED" if all(c["ok"] for c in cases) else "FAILED")
        sys.exit(0 if all(c["ok"] for c in cases) else 1)
    result["end_to_end_api_run"] = end_to_end()
    print("end to end:", {k: v for k, v in result["end_to_end_api_run"].items() if k != "traceback"})
    if not args.skip_nccl_probe:
        result["nccl_duplicate_gpu"] = nccl_duplicate_probe()
        print("nccl duplicate gpu probe:", result["nccl_duplicate_gpu"])
    result["ok"] = all(c["ok"] for c in cases) and result["end_to_end_api_run"].get("ok", True)
    result["wall_s"] = round(time.monotonic() - t_all, 1)
    text = json.dumps(result, indent=2, default=str)
    targets = [ROOT / "bench" / "results" / "runtime_cuda.json"]
    if os.environ.get("OUT"):
        targets.append(Path(os.environ["OUT"]) / "runtime_cuda.json")
    for t in targets:
        t.parent.mkdir(parents=True, exist_ok=True)
        t.write_text(text + "\n")
    print(f"runtime_cuda_check: {'PASSED' if result['ok'] else 'FAILED'} in {result['wall_s']} s; wrote "
          + ", ".join(map(str, targets)))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
