"""Per-worker-kind CPU profiles of the engine's kernels, and the cost model the planner prices them with.

``profile_kinds`` starts, for each CPU worker of a run, one profiling worker of its kind (``devices.
WorkerKind``: threads, duty-cycle speed) holding the whole model, all at once (each kind timed while the
others compute beside it, as in the run), and times every node of the program at the iteration shapes
the serving model samples
(``profile_shapes``: decodes of one and of a whole group at a short and a long context, a prompt chunk
alone and after a prefix, a group's decodes beside a chunk), medians over repeats. Each node is one
kernel of ``kernels.kernel_graph`` at that shape, with its FLOPs and bytes; the nodes of one class (the
same module in every layer, ``node_class``) are fitted together as

    seconds = a + b · FLOPs + c · bytes        (a, b, c ≥ 0; least squares over the feasible subsets)

so any shape the planner asks for is priced from what this kind measured (``ProfileCost``). Profiles are
kept as JSON under ``profile_dir()`` (``TESSERA_PROFILE_DIR``, default ~/.cache/tessera/profiles), one
file per model, dtype, page size and kind, and the link between two local workers beside them
(``measure_link``: per crossing, what an iteration gains when its values cross between two workers).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from tessera.engine.cluster import EngineCluster
from tessera.engine.config import EngineConfig
from tessera.engine.devices import WorkerKind
from tessera.engine.inputs import IterationInputs, IterationShape, build_inputs, shape_pieces
from tessera.engine.kernels import kernel_graph
from tessera.engine.loader import ModelSource
from tessera.engine.models import construct
from tessera.engine.program import Program
from tessera.engine.routes import transfers
from tessera.graph import Kernel
from tessera.hardware import GpuSpec, LinkSpec

PROFILE_VERSION = 2  # 2: kinds of a split profiled side by side for CORUN_S per shape
CORUN_S = 3.0  # seconds every profiling worker of a split keeps timing each shape
_LAYER = re.compile(r"(^|\.)layers\.\d+(\.|$)")


def profile_dir() -> Path:
    return Path(os.environ.get("TESSERA_PROFILE_DIR") or Path.home() / ".cache" / "tessera" / "profiles")


def node_class(k: Kernel) -> str:
    """Kernels priced by one fit: the nodes of the same module in any layer (a decode-only and a chunked
    attention are one class: its FLOPs and bytes tell them apart); a node made outside any module (the
    logits gather) by its name."""
    return _LAYER.sub(r"\1layers.N\2", k.module) or f"@{k.name}"


@dataclass(frozen=True, kw_only=True)
class KindProfile:
    """One worker kind's fits: node class -> (a s, b s/FLOP, c s/byte), and the samples' spread."""

    version: int = PROFILE_VERSION
    kind: str
    model: str
    dtype: str
    page_size: int
    shapes: tuple[dict[str, int], ...]
    fits: dict[str, tuple[float, float, float]] = field(hash=False)
    iteration_s: tuple[float, ...] = ()  # measured whole-iteration seconds (sum of nodes) per shape
    among: int = 1  # profiling workers computing at the same time (the run's CPU worker count)

    def time_s(self, k: Kernel) -> float:
        a, b, c = self.fits[node_class(k)]
        return a + b * k.flops + c * (k.bytes_read + k.bytes_written)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> KindProfile:
        d = json.loads(path.read_text())
        if d.get("version") != PROFILE_VERSION:
            raise ValueError(f"profile {path}: version {d.get('version')!r} is not {PROFILE_VERSION}")
        return cls(**{**d, "shapes": tuple(d["shapes"]), "iteration_s": tuple(d["iteration_s"]),
                      "fits": {k: tuple(v) for k, v in d["fits"].items()}})


def profile_shapes(config: EngineConfig, context: int) -> tuple[IterationShape, ...]:
    """Where each kind is timed: decodes of 1 and of a group (⌈B/m⌉) at ``context`` and at twice it, a
    chunk of the whole budget K, a chunk of K/2 after a prefix of K/2, and a group's decodes beside a chunk
    of K − ⌈B/m⌉."""
    g, k = config.group_seqs, config.max_num_batched_tokens
    return (IterationShape(decode=1, context=context), IterationShape(decode=g, context=context),
            IterationShape(decode=g, context=2 * context), IterationShape(chunks=1, chunk_len=k),
            IterationShape(chunks=1, chunk_len=max(1, k // 2), prefix=k // 2),
            IterationShape(decode=g, context=context, chunks=1, chunk_len=max(1, k - g)))


def profile_path(source: ModelSource, dtype: torch.dtype, kind: WorkerKind, config: EngineConfig,
                 corun: int = 1) -> Path:
    tag = zlib.crc32(repr((source.arch, config.group_seqs, config.max_num_batched_tokens)).encode())
    with_others = f"-among{corun}" if corun > 1 else ""
    name = (f"{source.name}-{str(dtype).removeprefix('torch.')}-p{config.page_size}-{tag:08x}-{kind.name}"
            f"{with_others}.json")
    return profile_dir() / name.replace(":", "_").replace("=", "")


def profile_kinds(source: ModelSource, dtype: torch.dtype, config: EngineConfig,
                  kinds: tuple[WorkerKind, ...], *, context: int, repeats: int = 5, seed: int = 0,
                  cached: bool = True) -> dict[str, KindProfile]:
    """Each CPU kind's profile, measured as the run's workers will compute: one profiling worker per entry of
    ``kinds``, all at the same time, so that each kind is timed while the others compute beside it (two
    workers on one host share its memory bandwidth and caches); a lone worker alone. From the files when
    every one is there (``cached``), else measured and saved (a kind listed twice: its workers' samples
    together)."""
    cpu = tuple(k for k in kinds if not k.cuda)
    paths = {k.name: profile_path(source, dtype, k, config, len(cpu)) for k in cpu}
    if cached and paths and all(p.is_file() for p in paths.values()):
        return {name: KindProfile.load(p) for name, p in paths.items()}
    if not cpu:
        return {}
    shapes = profile_shapes(config, context)
    need = max(sum(len(p.pages) for p in shape_pieces(s, config.page_size)) for s in shapes)
    cfg = EngineConfig(max_num_seqs=max(config.max_num_seqs, max(s.sequences for s in shapes)),
                       max_num_batched_tokens=config.max_num_batched_tokens, page_size=config.page_size,
                       num_pages=max(need, 1), max_model_len=config.max_model_len, microbatches=1)
    whole = (0,) * _node_count(source, dtype, config)
    clusters = [EngineCluster(source, dtype, cfg, (k,), whole, load_format="dummy", seed=seed) for k in cpu]
    samples: dict[str, dict[str, list[tuple[float, float, float]]]] = {k.name: {} for k in cpu}
    totals: dict[str, list[float]] = {k.name: [] for k in cpu}
    try:
        for c in clusters:
            c.start()
        for shape in shapes:
            inputs = build_inputs(shape_pieces(shape, config.page_size), config.page_size)
            # side by side for as long as the slowest kind takes its repeats: each kind is timed while the
            # others compute as much as they do in a run, not only while they happen to overlap
            sids = [c.start_profile(inputs, repeats, min_s=CORUN_S if len(clusters) > 1 else 0.0)
                    for c in clusters]
            graph = kernel_graph(source.arch, shape, dtype=dtype, page_size=config.page_size)
            for k, c, sid in zip(cpu, clusters, sids, strict=True):
                node_s = c.profile(sid)
                for name, kern in zip(graph.meta["nodes"], graph.kernels, strict=True):
                    samples[k.name].setdefault(node_class(kern), []).append(
                        (kern.flops, kern.bytes_read + kern.bytes_written, node_s[name]))
                totals[k.name].append(sum(node_s.values()))
    finally:
        for c in clusters:
            c.close()
    out = {}
    for k in cpu:
        out[k.name] = KindProfile(kind=k.name, model=source.name, dtype=str(dtype).removeprefix("torch."),
                                  page_size=config.page_size, shapes=tuple(s.as_dict() for s in shapes),
                                  fits={c: fit(v) for c, v in samples[k.name].items()},
                                  iteration_s=tuple(totals[k.name]), among=len(cpu))
        out[k.name].save(paths[k.name])
    return out


def _node_count(source: ModelSource, dtype: torch.dtype, config: EngineConfig) -> int:
    graph = kernel_graph(source.arch, IterationShape(decode=1, context=1), dtype=dtype,
                         page_size=config.page_size)
    return len(graph.kernels)


def fit(samples: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """(a, b, c) ≥ 0 of seconds = a + b·flops + c·bytes, least squares over the feasible subsets of the
    three terms (the unconstrained fit when it is feasible)."""
    x = np.array([[1.0, f, b] for f, b, _ in samples])
    y = np.array([t for _, _, t in samples])
    scale = np.maximum(np.abs(x).max(axis=0), 1e-30)  # columns of very different magnitude
    best: tuple[float, np.ndarray] | None = None
    for r in range(1, 4):
        for cols in itertools.combinations(range(3), r):
            coef, *_ = np.linalg.lstsq(x[:, cols] / scale[list(cols)], y, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(3)
            full[list(cols)] = coef / scale[list(cols)]
            sse = float(((x @ full - y) ** 2).sum())
            if best is None or sse < best[0] - 1e-30:
                best = (sse, full)
    assert best is not None, "a single positive column always fits"
    a, b, c = best[1]
    return float(a), float(b), float(c)


class ProfileCost:
    """The planner's cost model (``kernel_time_s``, ``transfer_time_s``) for worker kinds: a kernel on a
    device named after a profiled kind is priced by that kind's fit; any other device by ``fallback``
    (tessera.cost's calibrated model: catalog GPUs)."""

    def __init__(self, profiles: dict[str, KindProfile], fallback: object | None = None) -> None:
        self.profiles = profiles
        self.fallback = fallback

    def kernel_time_s(self, kernel: Kernel, gpu: GpuSpec) -> float:
        prof = self.profiles.get(gpu.name)
        if prof is not None:
            return prof.time_s(kernel)
        assert self.fallback is not None, f"no profile of {gpu.name} and no fallback cost model"
        return self.fallback.kernel_time_s(kernel, gpu)

    def transfer_time_s(self, nbytes: int, link: LinkSpec) -> float:
        return link.latency_s + nbytes / (link.bytes_per_s * link.efficiency)


@dataclass(frozen=True, kw_only=True)
class MeasuredLink:
    """The link as the engine's workers meet it: the start-up probe's bandwidth, and per value crossing
    between workers the seconds an iteration gains (its receive path: the waiting thread's wake-up, the
    worker's turn, both ends' CPU), from the same iterations run on one worker and on two that hand the
    iteration to each other after every node; never below the probe's one-way latency."""

    latency_s: float  # per crossing, as the engine meets it
    bytes_per_s: float
    probe_latency_s: float = 0.0  # the start-up ping-pong's one-way latency, for reference
    crossings: int = 0
    one_worker_s: float = 0.0  # median iteration, submit to logits
    two_workers_s: float = 0.0

    def spec(self) -> LinkSpec:
        return LinkSpec(name="gloo-engine", bytes_per_s=self.bytes_per_s, latency_s=self.latency_s,
                        source="two local engine workers: per crossing as an iteration meets it; "
                               "bandwidth probed")


def link_path(source: ModelSource) -> Path:
    return profile_dir() / f"gloo-link-{source.name}.json"


def measure_link(source: ModelSource, dtype: torch.dtype, config: EngineConfig, *, cached: bool = True,
                 iterations: int = 20) -> MeasuredLink:
    """MeasuredLink for ``source``: a one-token decode iteration run ``iterations`` times (after 3 untimed) on
    one ``cpu`` worker and on two taking the program's nodes in turn (node i on worker i mod 2: a value
    crosses after almost every node, so the crossings' cost stands well above the runs' noise); lower
    quartiles (the runs least disturbed by other work on the machine)."""
    path = link_path(source)
    if cached and path.is_file():
        return MeasuredLink(**json.loads(path.read_text()))
    shape = IterationShape(decode=1, context=1)
    inputs = build_inputs(shape_pieces(shape, config.page_size), config.page_size)
    cfg = EngineConfig(max_num_seqs=max(config.max_num_seqs, shape.sequences), page_size=config.page_size,
                       max_num_batched_tokens=config.max_num_batched_tokens,
                       max_model_len=config.max_model_len,
                       num_pages=sum(len(p.pages) for p in shape_pieces(shape, config.page_size)))
    with torch.device("meta"):
        program = Program(construct(source.arch, dtype))
    alternate = tuple(i % 2 for i in range(len(program.kernels)))
    crossings = len(transfers(program, alternate))
    cpu = WorkerKind(device="cpu")
    one, _ = _iteration_s(source, dtype, cfg, (cpu,), (0,) * len(alternate), inputs, iterations)
    two, probe = _iteration_s(source, dtype, cfg, (cpu, cpu), alternate, inputs, iterations)
    got = MeasuredLink(latency_s=max(probe[0], (two - one) / crossings), bytes_per_s=probe[1],
                       probe_latency_s=probe[0], crossings=crossings, one_worker_s=one, two_workers_s=two)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(got)))
    return got


def _iteration_s(source: ModelSource, dtype: torch.dtype, config: EngineConfig,
                 kinds: tuple[WorkerKind, ...], assignment: tuple[int, ...], inputs: IterationInputs,
                 iterations: int) -> tuple[float, object]:
    """Lower-quartile seconds from submitting an iteration to its logits on these workers, and their link
    probe."""
    times = []
    with EngineCluster(source, dtype, config, kinds, assignment, load_format="dummy", seed=0) as cluster:
        for i in range(iterations + 3):
            t0 = time.perf_counter()
            sid = cluster.submit(inputs)
            while sid not in cluster.poll(1.0):
                pass
            if i >= 3:
                times.append(time.perf_counter() - t0)
        return statistics.quantiles(times, n=4)[0], cluster.link
