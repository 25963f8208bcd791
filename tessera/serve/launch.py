"""The server put together: the engine and its workers (or the program in this process for a lone
``cpu``), the engine thread, the FastAPI app under uvicorn. SIGTERM or SIGINT (uvicorn's handlers) stops
accepting connections, lets every request in flight finish, then stops the engine thread and the
workers; a second signal cuts the drain short."""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import uvicorn
from uvicorn.server import HANDLED_SIGNALS

from tessera.engine.adaptive import AdaptiveSettings, Switcher, switcher_for
from tessera.engine.cluster import ClusterSettings
from tessera.engine.config import EngineConfig
from tessera.engine.devices import WorkerKind
from tessera.engine.engine import Engine, load_engine, resolve_dtype
from tessera.engine.generate import in_process
from tessera.engine.loader import open_model
from tessera.engine.serve import InProcess, WorkerPool
from tessera.engine.serve_run import Costs, check_host_memory, check_worker_memory, placer_for
from tessera.engine.tokenizer import tokenizer_for
from tessera.errors import UserError
from tessera.plan import Traffic
from tessera.serve.app import Server, build_app
from tessera.serve.config import ServerConfig, default_model_len
from tessera.serve.loop import EngineThread
from tessera.serve.metrics import Metrics

# what --placement plan places for: a server does not know its traffic in advance (the planner's default
# request shape, shortened to the model length)
PLAN_TRAFFIC = Traffic(prompt=256, output=128)


@dataclass(frozen=True, kw_only=True)
class ServeSpec:
    model: str  # zoo name or model directory
    kinds: tuple[WorkerKind, ...]
    placement: str = "layer_split"  # a rule, "plan", or a PLAN.json
    replan: str = "layer_split"  # after a lost worker (a lone survivor runs everything)
    config: EngineConfig  # serve(): max_model_len None is the model's context, at most DEFAULT_MODEL_LEN
    dtype: str = "auto"
    load_format: str = "auto"
    seed: int = 0
    settings: ClusterSettings = field(default_factory=ClusterSettings)
    server: ServerConfig
    adaptive: AdaptiveSettings | None = None  # --adaptive: a latency schedule, switched to by queue depth

    def __post_init__(self) -> None:
        if not self.kinds:
            raise UserError("--devices names no device; e.g. cpu or cpu,cpu")
        if self.adaptive is not None and in_process(self.kinds):
            raise UserError("--adaptive switches the schedules of worker processes; a lone cpu runs in this "
                            "process: give --devices cpu,cpu (or cpu:threads=1 for one worker)")


@dataclass
class Opened:
    """The engine and what runs its iterations: the pool, the adaptive switch and every pool to close."""

    engine: Engine
    pool: WorkerPool | InProcess
    switch: Switcher | None = None
    pools: list[WorkerPool] = field(default_factory=list)

    def close(self) -> None:
        for p in self.pools:
            p.__exit__(None, None, None)


def open_engine(spec: ServeSpec) -> Opened:
    """The driver engine and its started pools (the caller closes them: ``Opened.close``)."""
    source = open_model(spec.model)
    codec = tokenizer_for(source)
    if in_process(spec.kinds):
        engine = load_engine(source, spec.config, dtype=spec.dtype, load_format=spec.load_format,
                             seed=spec.seed, codec=codec)
        return Opened(engine=engine, pool=InProcess(engine))
    if spec.load_format == "auto" and not source.has_weights:
        raise UserError(f"{source.name} has no safetensors weights to load; use --load-format dummy")
    dtype = resolve_dtype(spec.dtype, source)
    length = spec.config.model_len(source.arch) or PLAN_TRAFFIC.prompt + PLAN_TRAFFIC.output
    traffic = Traffic(prompt=max(1, min(PLAN_TRAFFIC.prompt, length // 2)),
                      output=max(1, min(PLAN_TRAFFIC.output, length // 4)))
    costs = Costs(source, dtype, spec.config, context=traffic.prompt + traffic.output // 2)
    check_host_memory(source, dtype, spec.config, spec.kinds)
    placement = placer_for(spec.placement, source, dtype, spec.config, traffic, costs)(spec.kinds)
    check_worker_memory(source, dtype, spec.config, spec.kinds, placement.assignment)
    engine = Engine(None, source, spec.config, codec, devices=tuple(k.name for k in spec.kinds),
                    placement=placement.label)
    pool = WorkerPool(source, dtype, spec.config, spec.kinds, lambda _k: placement,
                      load_format=spec.load_format, seed=spec.seed, settings=spec.settings,
                      replacer=placer_for(spec.replan, source, dtype, spec.config, traffic, costs))
    opened = Opened(engine=engine, pool=pool, pools=[pool])
    pool.__enter__()
    a = spec.adaptive
    if a is None:
        return opened
    latency = None
    if a.latency_placement not in (None, spec.placement):
        chosen = placer_for(a.latency_placement, source, dtype, spec.config, traffic, costs)(spec.kinds)
        check_worker_memory(source, dtype, spec.config, spec.kinds, chosen.assignment)
        latency = WorkerPool(source, dtype, spec.config, spec.kinds, lambda _k: chosen,
                             load_format=spec.load_format, seed=spec.seed, settings=spec.settings)
        opened.pools.append(latency)
        latency.__enter__()
    opened.switch = switcher_for(a, spec.config, pool, latency)
    opened.switch.start(engine)
    return opened


class Uvicorn(uvicorn.Server):
    """uvicorn's server, saying when it listens and when it drains."""

    def __init__(self, config: uvicorn.Config, banner: str, quiet: bool = False) -> None:
        super().__init__(config)
        self.banner, self.quiet = banner, quiet

    @property
    def port(self) -> int:
        return self.servers[0].sockets[0].getsockname()[1]

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and not self.quiet:
            print(f"{self.banner} at http://{self.config.host}:{self.port}/v1", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's handlers (SIGINT, SIGTERM: drain; a second SIGINT: stop now), without raising the
        signal again once drained: the server then closes its workers and exits 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets=None) -> None:
        if not self.quiet:
            print("draining: no new connections; waiting for the requests in flight", file=sys.stderr,
                  flush=True)
        await super().shutdown(sockets)


class Running:
    """A server over ``engine`` and ``pool``: ``serve_forever`` in this (main) thread with signal handling,
    or ``start_background`` in a thread (tests); ``close`` stops the engine thread (the caller owns the
    pool)."""

    def __init__(self, engine: Engine, pool: WorkerPool | InProcess, config: ServerConfig, *,
                 recover: bool = True, quiet: bool = False, switch: Switcher | None = None) -> None:
        self.metrics = Metrics(engine.devices)
        self.thread = EngineThread(engine, pool, self.metrics,
                                   max_outstanding=engine.config.max_num_seqs + config.max_waiting,
                                   recover=recover and switch is None, switch=switch)
        self.server = Server(engine, self.thread, config, draining=lambda: self.uv.should_exit)
        self.app = build_app(self.server)
        banner = (f"serving {config.served_model_name} ({engine.source.name} on {','.join(engine.devices)}, "
                  f"{engine.placement})")
        self.uv = Uvicorn(uvicorn.Config(self.app, host=config.host, port=config.port, log_level="warning",
                                         access_log=False, timeout_keep_alive=30), banner, quiet)
        self.background: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.uv.config.host}:{self.uv.port}"

    def serve_forever(self) -> None:
        self.thread.start()
        try:
            self.uv.run()
        finally:
            self.thread.stop()

    def start_background(self, timeout_s: float = 60.0) -> Running:
        self.thread.start()
        self.background = threading.Thread(target=self.uv.run, name="tessera-uvicorn", daemon=True)
        self.background.start()
        deadline = time.monotonic() + timeout_s
        while not self.uv.started:
            if time.monotonic() > deadline or not self.background.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        self.uv.should_exit = True
        if self.background is not None:
            self.background.join(30)
        self.thread.stop()


def check_port(host: str, port: int) -> None:
    """Before the model loads: the address can be listened on (one line naming it otherwise)."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
        except OSError as e:
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}; give another --port (0: any "
                            f"free port) or --host") from None


def serve(spec: ServeSpec) -> None:
    """``tessera serve``: until SIGTERM/SIGINT, then drained; without a model length, the model's context
    window at most DEFAULT_MODEL_LEN (default_model_len)."""
    if spec.config.max_model_len is None:
        length = default_model_len(open_model(spec.model).arch.context_window)
        spec = replace(spec, config=replace(spec.config, max_model_len=length))
    check_port(spec.server.host, spec.server.port)
    opened = open_engine(spec)
    try:
        Running(opened.engine, opened.pool, spec.server, switch=opened.switch).serve_forever()
    finally:
        opened.close()
