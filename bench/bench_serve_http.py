"""`tessera serve` under a standard load generator, beside the engine driven in-process and vLLM's CPU server.

Load generator: vLLM's `vllm bench serve` (the client the vLLM project measures OpenAI-compatible servers
with; installed from the package registry in its own venv, --vllm-venv, see bench/bench_peers.py), backend
`openai` against /v1/completions, its `random` dataset: --num-prompts prompts of --input-len tokens, each
generating --output-len tokens (EOS ignored), Poisson arrivals at each --rates value (inf: all at once).

Model: Qwen2.5-0.5B's published config (bench/workloads/qwen2.5-0.5b) with dummy (random) weights in bf16,
and a byte-level BPE tokenizer of 2,000 tokens trained here on docs/*.md, which the load generator, tessera
serve and vllm serve all read: random weights make any tokenizer's text meaningless, and this one needs no
download. Prompt lengths are the load generator's; each server's own count per request is kept
(``mean_prompt_tokens``, from its /metrics).

Systems, one after another on this machine:
  - tessera serve on 2 CPU worker processes (--devices, --placement; OMP_NUM_THREADS=1 per worker).
  - the same engine, placement and settings driven in-process by `serve-run`'s drive() on a Poisson stream
    of the same rate, count and lengths (tessera.sim's generator; the figures to hold the server's against:
    the overhead is 1 - server throughput / in-process throughput).
  - vllm serve (CPU build), --vllm-threads OpenMP threads, the same limits (max-num-seqs,
    max-num-batched-tokens, max-model-len); skipped with the reason when it does not start.

Figures per (system, rate): output tokens/s, TTFT and TPOT p50/p99 (the load generator's for the servers,
drive()'s for in-process), the 1-minute load average before and after and the server's threads.
Writes bench/results/serve_http.json and .md.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_serve_http.py --vllm-venv /work/peers/vllm
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODEL_CONFIG = ROOT / "bench/workloads/qwen2.5-0.5b/config.json"
NAME = "qwen2.5-0.5b"
VOCAB = 2000  # tokens of the bench tokenizer
START_TIMEOUT_S = 600


def make_model_dir(directory: Path) -> Path:
    """The config and a byte-level BPE tokenizer of 2,000 tokens trained here on docs/*.md (no weights:
    --load-format dummy). Byte-level, as Qwen2's own, so that the load generator's random token ids decode
    to text that encodes back to about as many tokens, whichever tokenizer class reads it."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL_CONFIG, directory / "config.json")
    corpus = [f.read_text() for f in sorted((ROOT / "docs").glob("*.md"))]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=VOCAB, min_frequency=1,
                            special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(directory)
    return directory


def prompt_tokens(port: int) -> float | None:
    """The server's prompt-token counter from /metrics (tessera's or vLLM's name), None if it has none."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.split("{")[0] in ("tessera_prompt_tokens_total", "vllm:prompt_tokens_total"):
            return float(value.split()[0])
    return None


def threads_of(pid: int) -> int:
    """Threads of ``pid`` and of all its descendants (a server's workers are its children)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total


def wait_health(proc: subprocess.Popen, port: int, log: Path) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < START_TIMEOUT_S:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server not ready after {START_TIMEOUT_S} s: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def load_generator(args: argparse.Namespace, port: int, rate: str, out: Path, directory: Path
                   ) -> dict[str, Any]:
    """One `vllm bench serve` run; its saved result."""
    name = f"{out.name}.json"
    cmd = [str(args.vllm_venv / "bin" / "vllm"), "bench", "serve", "--backend", "openai", "--base-url",
           f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions", "--model", NAME, "--tokenizer",
           str(directory), "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--random-range-ratio", "0", "--ignore-eos",
           "--request-rate", rate, "--num-prompts", str(args.num_prompts), "--seed", "0",
           "--temperature", "0",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--disable-tqdm",
           "--save-result", "--result-dir", str(out.parent), "--result-filename", name]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    (out.parent / f"{out.name}.log").write_text(done.stdout[-20000:] + done.stderr[-20000:])
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads((out.parent / name).read_text())


def figures_of(raw: dict[str, Any]) -> dict[str, Any]:
    ms = 1e-3
    return {"output_tokens_per_s": raw["output_throughput"], "completed": raw["completed"],
            "ttft_s": {"p50": raw["p50_ttft_ms"] * ms, "p99": raw["p99_ttft_ms"] * ms},
            "tpot_s": {"p50": raw["p50_tpot_ms"] * ms, "p99": raw["p99_tpot_ms"] * ms},
            "duration_s": raw["duration"], "output_tokens": raw["total_output_tokens"]}


def serve_rates(args: argparse.Namespace, system: str, cmd: list[str], env: dict[str, str], port: int,
                work: Path, directory: Path, beside: Any = None) -> dict[str, Any]:
    """Start a server, run every rate against it, stop it. ``beside(rate)``, if given, runs right after each
    rate's row (the in-process rows, back to back with the server's, so both see the same machine load)."""
    log = work / f"{system}_server.log"
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    rows: dict[str, Any] = {}
    try:
        start_s = wait_health(proc, port, log)
        for rate in args.rates:
            load0, before = os.getloadavg()[0], prompt_tokens(port)
            raw = load_generator(args, port, rate, work / f"{system}_{rate}", directory)
            after = prompt_tokens(port)
            rows[rate] = figures_of(raw) | {"loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
                                            "threads": threads_of(proc.pid)}
            if before is not None and after is not None:  # what the server counted, its own tokenizer's
                rows[rate]["mean_prompt_tokens"] = (after - before) / max(1, raw["completed"])
            print(f"{system} rate {rate}: {rows[rate]['output_tokens_per_s']:.1f} tok/s", file=sys.stderr)
            if beside is not None:
                beside(rate)
    finally:
        stop(proc)
    return {"start_s": start_s, "rates": rows}


def tessera_server(args: argparse.Namespace, directory: Path, work: Path, beside: Any = None
                   ) -> dict[str, Any]:
    port = free_port()
    cmd = [sys.executable, "-m", "tessera", "serve", str(directory), "--served-model-name", NAME,
           "--load-format", "dummy", "--dtype", "bf16", "--devices", args.devices, "--placement",
           args.placement, "--port", str(port), "--microbatches", str(args.microbatches), *engine_flags(args)]
    return serve_rates(args, "tessera", cmd, dict(os.environ, OMP_NUM_THREADS="1"), port, work, directory,
                       beside)


def vllm_server(args: argparse.Namespace, directory: Path, work: Path) -> dict[str, Any]:
    port = free_port()
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="2",
               VLLM_CPU_OMP_THREADS_BIND="0" if args.vllm_threads == 1 else f"0-{args.vllm_threads - 1}",
               OMP_NUM_THREADS=str(args.vllm_threads))
    cmd = [str(args.vllm_venv / "bin" / "vllm"), "serve", str(directory), "--served-model-name", NAME,
           "--load-format", "dummy", "--dtype", "bfloat16", "--enable-chunked-prefill", "--seed", "0",
           "--host", "127.0.0.1", "--port", str(port), *engine_flags(args)]
    return serve_rates(args, "vllm", cmd, env, port, work, directory)


def engine_flags(args: argparse.Namespace) -> list[str]:
    return ["--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens",
            str(args.max_num_batched_tokens), "--max-model-len", str(args.max_model_len)]


def in_process(args: argparse.Namespace, directory: Path, rates: list[str]) -> dict[str, Any]:
    """The same engine and placement driven by drive() (serve-run) on a Poisson stream of each rate."""
    from tessera.engine.config import EngineConfig
    from tessera.engine.devices import parse_devices
    from tessera.engine.serve_run import ServeRunSpec, serve_run
    from tessera.sim.workload import LengthSpec, WorkloadSpec

    config = EngineConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          max_model_len=args.max_model_len, microbatches=args.microbatches)
    rows: dict[str, Any] = {}
    for rate in rates:
        wl = WorkloadSpec(kind="offline" if rate == "inf" else "poisson", requests=args.num_prompts,
                          rate_per_s=0.0 if rate == "inf" else float(rate),
                          prompt=LengthSpec.parse(str(args.input_len)),
                          output=LengthSpec.parse(str(args.output_len)))
        spec = ServeRunSpec(model=str(directory), kinds=parse_devices(args.devices), placement=args.placement,
                            workload=wl, config=config, dtype="bf16", load_format="dummy")
        load0 = os.getloadavg()[0]
        got = serve_run(spec)
        rows[rate] = {"output_tokens_per_s": got.throughput_tokens_per_s, "completed": got.completed,
                      "ttft_s": got.ttft_s, "tpot_s": got.tpot_s,
                      "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
                      "threads": got.extra["threads"]}
        print(f"in-process rate {rate}: {got.throughput_tokens_per_s:.1f} tok/s", file=sys.stderr)
    return {"rates": rows}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def markdown(doc: dict[str, Any]) -> str:
    a = doc["args"]
    lines = [
        "# tessera serve under vllm bench serve",
        "",
        f"Qwen2.5-0.5B config, dummy bf16 weights; {a['num_prompts']} prompts of {a['input_len']} tokens, "
        f"{a['output_len']} output tokens each (EOS ignored); tessera on `--devices {a['devices']} "
        f"--placement {a['placement']} --microbatches {a['microbatches']}` (1 thread per worker), "
        f"max-num-seqs {a['max_num_seqs']}, max-num-batched-tokens "
        f"{a['max_num_batched_tokens']}; vLLM CPU with {a['vllm_threads']} OpenMP thread(s). Load generator: "
        f"`vllm bench serve --backend openai --dataset-name random` (Poisson arrivals; inf: all at once). "
        f"In-process: the same engine under drive() (serve-run) on a Poisson stream of the same rate and "
        f"lengths, each rate right after the server's. Machine: 2 cores shared with other work (load average "
        f"before/after each row). Threads: the server's process tree (driver and workers) after the row; "
        f"in-process: torch threads per process.",
        "",
        "| system | rate (req/s) | output tok/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | load 1m "
        "| threads |",
        "|---|---|---|---|---|---|---|",
    ]
    for system, res in doc["systems"].items():
        if "skipped" in res:
            lines.append(f"| {system} | - | skipped: {res['skipped']} | | | | |")
            continue
        for rate, r in res["rates"].items():
            lines.append(
                f"| {system} | {rate} | {r['output_tokens_per_s']:.1f} | {r['ttft_s']['p50'] * 1e3:.0f} / "
                f"{r['ttft_s']['p99'] * 1e3:.0f} | {r['tpot_s']['p50'] * 1e3:.0f} / "
                f"{r['tpot_s']['p99'] * 1e3:.0f} | {r['loadavg_1m'][0]} → {r['loadavg_1m'][1]} "
                f"| {r['threads']} |")
    if doc.get("overhead"):
        lines += ["", "Server overhead on throughput (1 − tessera serve / in-process; negative: the server "
                  "was faster): "
                  + ", ".join(f"rate {k}: {v * 100:+.1f}%" for k, v in doc["overhead"].items())
                  + ". The figure to read is at `inf` (both saturated: throughput is capacity); below "
                  "capacity each system's throughput follows its own generator's Poisson draw of 16 arrival "
                  "times (vllm bench's and tessera.sim's differ), so there the latencies compare, not the "
                  "throughput."]
    counted = ", ".join(f"{name} {r['rates'][k]['mean_prompt_tokens']:.1f}"
                        for name, r in doc["systems"].items() for k in list(r.get("rates", {}))[:1]
                        if "mean_prompt_tokens" in r["rates"][k])
    lines += ["", "Percentiles: the servers' are `vllm bench serve`'s (numpy, interpolated: p50 of 16 "
              "requests is the mean of the 8th and 9th); in-process ones are serve-run's nearest rank (the "
              "8th). With max-num-seqs 8 and 16 requests at once, the 8th and 9th TTFT lie on either side "
              "of the first 8 requests' decode, hence the `inf` TTFT p50 gap. Prompt tokens as each server "
              f"counted them (its tokenizer; /metrics), mean per request: {counted}; in-process "
              f"{doc['args']['input_len']}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="0.25,0.5,inf", help="request rates per second, comma-separated (inf: "
                   "all at once)")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--devices", default="cpu,cpu")
    p.add_argument("--placement", default="layer_split")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-num-batched-tokens", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=256)
    p.add_argument("--microbatches", type=int, default=2, help="tessera's groups in flight (pipelining the "
                   "split)")
    p.add_argument("--vllm-venv", type=Path, default=os.environ.get("VLLM_VENV"))
    p.add_argument("--vllm-threads", type=int, default=2)
    p.add_argument("--systems", default="tessera,in-process,vllm")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/serve_http")
    p.add_argument("--reuse-vllm", type=Path, help="take vLLM's rows from an earlier result (same arguments)")
    args = p.parse_args()
    args.rates = args.rates.split(",")
    if args.vllm_venv is None or not (Path(args.vllm_venv) / "bin/vllm").exists():
        sys.exit("the load generator is vllm bench serve: give --vllm-venv (see bench/bench_peers.py)")
    args.vllm_venv = Path(args.vllm_venv)
    systems = args.systems.split(",")
    doc: dict[str, Any] = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                           "systems": {}, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="serve_http_") as tmp:
        work = Path(tmp)
        directory = make_model_dir(work / "model")
        inproc: dict[str, Any] = {"rates": {}}
        if "in-process" in systems:
            doc["systems"]["in-process drive()"] = inproc

        def beside(rate: str) -> None:
            if "in-process" in systems:
                inproc["rates"] |= in_process(args, directory, [rate])["rates"]
        if "tessera" in systems:
            doc["systems"]["tessera serve"] = tessera_server(args, directory, work, beside)
        elif "in-process" in systems:
            inproc |= in_process(args, directory, args.rates)
        if args.reuse_vllm is not None:
            doc["systems"]["vllm serve"] = json.loads(args.reuse_vllm.read_text())["systems"]["vllm serve"]
        elif "vllm" in systems:
            try:
                doc["systems"]["vllm serve"] = vllm_server(args, directory, work)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                doc["systems"]["vllm serve"] = {"skipped": str(e).splitlines()[0][:200]}
    s, i = doc["systems"].get("tessera serve"), doc["systems"].get("in-process drive()")
    if s and i:
        doc["overhead"] = {r: 1 - s["rates"][r]["output_tokens_per_s"] / i["rates"][r]["output_tokens_per_s"]
                           for r in args.rates}
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
