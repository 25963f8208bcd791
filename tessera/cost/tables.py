"""Measured kernel tables per GPU (``<dir>/<system>/<table>.csv``, written by `tessera cost import aic`)
and interpolation over their grids.

A table's rows are shapes (its key columns) with a measured latency in milliseconds. A roofline
``launch + max(compute / compute_eff, memory / memory_eff)`` is fitted to the table (``fit_roofline``), each
row is normalised by it, and the table interpolates log(measured / roofline) multilinearly in log-shape
space. A query's time is the roofline there times the interpolated ratio: exact on a grid point, smooth
between grid points, and, outside the grid, the edge's ratio carried by the roofline's scaling. A grid corner the table lacks is left out
of the weights; a query with no corner at all takes its nearest row's ratio (in log-shape space).
"""

from __future__ import annotations

import csv
import math
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from tessera.cost.aic_import import SPECS, TABLES
from tessera.errors import UserError
from tessera.graph import Kernel, KernelKind
from tessera.hardware import GpuSpec, resolve_gpu

SHIPPED_AIC = Path(__file__).parent / "data" / "aic"
ELEM_BYTES = 2  # bf16: activations of every table, weights of the bf16 ones

KEYS: dict[str, tuple[str, ...]] = {name: tuple(spec.keep) for name, spec in SPECS.items()}
KERNEL_TABLES = ("gemm", "context_attention", "generation_attention", "moe",  # what kernels are priced from
                 "gemm_fp8", "moe_fp8_block")
GEMM_TABLES = ("gemm", "gemm_fp8")  # keys m, n, k
MOE_TABLES = ("moe", "moe_power_law", "moe_fp8_block")  # token axis first; times repaired to be monotone in it
# the fp8 tables: 1-byte weights at the fp8 peak; activations come and go in bf16 (2 bytes), as vLLM's fp8
# linear and fused MoE take and return them
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")  # the kernel dtypes capture records for fp8 checkpoints
TABLE_DTYPE = {"gemm_fp8": "float8_e4m3fn", "moe_fp8_block": "float8_e4m3fn"}  # others bfloat16
WEIGHT_BYTES = {"gemm_fp8": 1, "moe_fp8_block": 1}  # others ELEM_BYTES
FIT_ROWS = 3000  # rows (evenly spaced) a table's roofline is fitted on: plenty for three parameters
_COMPUTE = (0.02, 1.5)  # search ranges: efficiencies as fractions of peak, launch in seconds
_MEMORY = (0.02, 1.5)
_LAUNCH_S = (0.0, 40e-6)


@dataclass(frozen=True, kw_only=True)
class CacheModel:
    """When a GEMM's operands stay in L2 between runs, and how fast L2 then serves them.

    The tables time each shape by repeated runs on the same buffers, so a GEMM whose operands fit in a
    fraction of L2 reads them from L2, not DRAM: on the GDDR GPUs (L40S, RTX PRO 6000) GEMMs under ~16 MiB
    run at up to 2-3x DRAM bandwidth and fall back to ~0.8x above it. L2 bandwidth is not on datasheets;
    it scales with SMs x clock x lanes, as the FP32 peak does, so it is taken as
    ``l2_bytes_per_fp32_flop`` x FP32 peak (never below DRAM bandwidth: on HBM GPUs DRAM is the faster).
    The two constants are chosen by leave-one-GPU-out (nested in the accuracy figures)."""

    resident_fraction: float  # operands of at most this fraction of L2 bytes are served from L2
    l2_bytes_per_fp32_flop: float  # L2 bandwidth (B/s) per FP32 FLOP/s

    def __post_init__(self) -> None:
        if not (0 <= self.resident_fraction <= 1 and self.l2_bytes_per_fp32_flop >= 0):
            raise ValueError(f"cache model resident_fraction={self.resident_fraction} must be in [0, 1], "
                             f"l2_bytes_per_fp32_flop={self.l2_bytes_per_fp32_flop} >= 0")

    def memory_s(self, nbytes: np.ndarray, gpu: GpuSpec) -> np.ndarray:
        """Seconds to move ``nbytes`` of operands at efficiency 1: from L2 where they fit, else DRAM."""
        dram_bw = gpu.mem_bw_bytes_per_s
        l2_bw = max(dram_bw, self.l2_bytes_per_fp32_flop * gpu.peak("fp32"))
        return np.where(nbytes <= self.resident_fraction * gpu.l2_bytes, nbytes / l2_bw, nbytes / dram_bw)


# chosen by leave-one-GPU-out over the ten measured GPUs (bench/bench_cost_aic.py, which also reports the
# accuracy with this choice nested inside each fold); per GEMM table, over the GPUs that have it
DEFAULT_CACHE = CacheModel(resident_fraction=0.15, l2_bytes_per_fp32_flop=0.03)
TABLE_CACHE = {"gemm": DEFAULT_CACHE,  # others: DEFAULT_CACHE (unused)
               "gemm_fp8": CacheModel(resident_fraction=0.1, l2_bytes_per_fp32_flop=0.02)}


def unit_terms(name: str, p: np.ndarray, gpu: GpuSpec, *, kv_len: np.ndarray | None = None,
               cache: CacheModel = DEFAULT_CACHE) -> tuple[np.ndarray, np.ndarray]:
    """(compute_s, memory_s) of shapes ``p`` [N, len(KEYS[name])] of table ``name`` on ``gpu`` at
    efficiency 1: FLOPs at the dense peak of the table's dtype (bf16; fp8 for the fp8 tables, bf16 on a GPU
    without fp8 units), bytes at datasheet bandwidth (GEMM: from L2 where ``cache`` says its operands stay
    there); weights at the table's bytes per element, activations bf16.
    Attention FLOPs count the full (non-causal) score matrix, 4·b·h·q·kv·d, as capture does; ``kv_len``
    overrides a context row's key length, which is otherwise its query length (a chunk against a prefix)."""
    p = p.astype(float)
    peak, bw, e = gpu.peak(TABLE_DTYPE.get(name, "bfloat16")), gpu.mem_bw_bytes_per_s, ELEM_BYTES
    w = WEIGHT_BYTES.get(name, ELEM_BYTES)
    if name in GEMM_TABLES:
        m, n, k = p.T
        # plain FLOPs, no tile waves: the measured kernels pick their own tiles, and the table's ratio to
        # this fit carries the quantisation (waves made both interpolation and transfer worse here)
        return 2 * m * n * k / peak, cache.memory_s(e * (m * k + m * n) + w * k * n, gpu)
    if name in ("context_attention", "generation_attention"):
        b, length, h, kh, d = p.T
        if name == "context_attention":
            q, kv = length, (length if kv_len is None else kv_len)
        else:
            q, kv = np.ones_like(b), length
        return 4 * b * h * q * kv * d / peak, e * b * d * (2 * h * q + 2 * kh * kv) / bw
    if name in MOE_TABLES:  # gated experts: up (2·inter) + down (inter) per routed token; experts hit
        t, hid, inter, topk, experts = p.T
        active = experts * (1 - (1 - 1 / experts) ** (t * topk))
        return 6 * t * topk * hid * inter / peak, (w * 3 * active * hid * inter + e * 2 * t * hid) / bw
    raise ValueError(f"unknown table {name!r}; valid: {', '.join(TABLES)}")


def ideal_s(name: str, p: np.ndarray, gpu: GpuSpec, *, kv_len: np.ndarray | None = None,
            cache: CacheModel = DEFAULT_CACHE) -> np.ndarray:
    """Ideal time (s): the larger of ``unit_terms``."""
    return np.maximum(*unit_terms(name, p, gpu, kv_len=kv_len, cache=cache))


@dataclass(frozen=True, kw_only=True)
class Roofline:
    compute_eff: float
    memory_eff: float
    launch_s: float

    def __post_init__(self) -> None:
        if not (self.compute_eff > 0 and self.memory_eff > 0 and self.launch_s >= 0):
            raise ValueError(f"roofline compute_eff={self.compute_eff} memory_eff={self.memory_eff} "
                             f"launch_s={self.launch_s}: efficiencies must be > 0, launch >= 0")

    def time_s(self, compute_s: np.ndarray, memory_s: np.ndarray) -> np.ndarray:
        return self.launch_s + np.maximum(compute_s / self.compute_eff, memory_s / self.memory_eff)


def fit_roofline(compute_s: np.ndarray, memory_s: np.ndarray, measured_s: np.ndarray) -> Roofline:
    """The (compute eff, memory eff, launch) minimising mean |log(fit / measured)|: a 17^3 grid refined
    twice around its best point (three parameters, so exhaustive search is cheap and has no local minima)."""
    lo = np.array([_COMPUTE[0], _MEMORY[0], _LAUNCH_S[0]])
    hi = np.array([_COMPUTE[1], _MEMORY[1], _LAUNCH_S[1]])
    best = (lo + hi) / 2
    for _ in range(3):
        c, m, launch = (np.linspace(lo[i], hi[i], 17) for i in range(3))
        base = np.maximum(compute_s[None, None, :] / c[:, None, None], memory_s[None, None, :] / m[None, :, None])
        loss = np.stack([np.abs(np.log((base + x) / measured_s)).mean(axis=-1) for x in launch], axis=-1)
        i, j, k = np.unravel_index(np.argmin(loss), loss.shape)
        best = np.array([c[i], m[j], launch[k]])
        step = (hi - lo) / 16
        lo, hi = np.maximum(best - 2 * step, [1e-3, 1e-3, 0.0]), best + 2 * step
    return Roofline(compute_eff=float(best[0]), memory_eff=float(best[1]), launch_s=float(best[2]))


def query_of(kernel: Kernel) -> tuple[str, tuple[int, ...], int | None] | None:
    """(table, key, kv_len override) a captured kernel looks up, or None where no table applies.

    GEMM dims m, n, k (batch 1); a MoE kernel: dims tokens, hidden, inter, topk, experts; attention
    dims batch, heads, kv_heads, q_len, kv_len, head_dim (decode: q_len 1). bf16 kernels use the bf16
    tables, fp8 ones (capture's dtype for any fp8 checkpoint) the fp8 tables: MoE block-scaled, as the
    fp8 checkpoints served (DeepSeek-V3/R1, Qwen3 FP8) store their weights; GEMMs per-tensor, the GPU time
    of a block-scaled GEMM within the measured spread (aic_import's module doc)."""
    d = kernel.dims
    fp8 = kernel.dtype in FP8_DTYPES
    if kernel.dtype != "bfloat16" and not fp8:  # fp16 kernels fall through to Vidur's fp16 profiles
        return None
    if set(KEYS["moe"]) <= d.keys():
        return "moe_fp8_block" if fp8 else "moe", tuple(d[c] for c in KEYS["moe"]), None
    if kernel.kind is KernelKind.GEMM and {"m", "n", "k"} <= d.keys() and d.get("batch", 1) == 1:
        return "gemm_fp8" if fp8 else "gemm", (d["m"], d["n"], d["k"]), None
    if fp8:  # no fp8 attention tables
        return None
    attn = ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim")
    if kernel.kind in (KernelKind.ATTENTION, KernelKind.ATTENTION_DECODE) and set(attn) <= d.keys():
        b, h, kh, q, kv, hd = (d[c] for c in attn)
        if q == 1:
            return "generation_attention", (b, kv, h, kh, hd), None
        return "context_attention", (b, q, h, kh, hd), (kv if q != kv else None)
    return None


@dataclass(frozen=True, kw_only=True)
class MeasuredTable:
    """One GPU's measured times for one table: shapes [N, d] and seconds [N]."""

    name: str
    gpu: GpuSpec
    points: np.ndarray = field(hash=False)
    time_s: np.ndarray = field(hash=False)
    # the roofline fitted to these rows (None: fit on first use); interpolation runs on measured / roofline
    basis: Roofline | None = None
    cache: CacheModel = DEFAULT_CACHE  # the GEMM roofline's L2 term

    def __post_init__(self) -> None:
        if self.points.ndim != 2 or self.points.shape != (len(self.time_s), len(KEYS[self.name])):
            raise ValueError(f"table {self.name}: points {self.points.shape} do not match "
                             f"{len(self.time_s)} times x {len(KEYS[self.name])} keys")

    @cached_property
    def roofline(self) -> Roofline:
        if self.basis is not None:
            return self.basis
        rows = np.linspace(0, len(self.time_s) - 1, min(FIT_ROWS, len(self.time_s))).astype(int)
        return fit_roofline(*self.unit_terms(self.points[rows], self.gpu), self.time_s[rows])

    def unit_terms(self, points: np.ndarray, gpu: GpuSpec, *, kv_len: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
        """``unit_terms`` of this table's kind and cache model at ``points`` on ``gpu``."""
        return unit_terms(self.name, points, gpu, kv_len=kv_len, cache=self.cache)

    def roofline_s(self, points: np.ndarray, *, gpu: GpuSpec | None = None,
                   kv_len: np.ndarray | None = None) -> np.ndarray:
        """This table's fitted roofline at ``points`` (on ``gpu``: default this table's)."""
        return self.roofline.time_s(*self.unit_terms(points, gpu or self.gpu, kv_len=kv_len))

    @cached_property
    def _log_ratio(self) -> np.ndarray:
        return np.log(self.time_s / self.roofline_s(self.points))

    @cached_property
    def _axes(self) -> list[np.ndarray]:
        return [np.unique(self.points[:, j]) for j in range(self.points.shape[1])]

    @cached_property
    def _index(self) -> dict[int, int]:
        """Grid cell code (row-major over the axes' positions) -> row."""
        pos = [np.searchsorted(axis, self.points[:, j]) for j, axis in enumerate(self._axes)]
        codes = np.ravel_multi_index(pos, [len(a) for a in self._axes])
        return dict(zip(codes.tolist(), range(len(codes)), strict=True))

    @cached_property
    def _log_points(self) -> np.ndarray:
        return np.log(self.points.astype(float))

    def log_ratio(self, key: tuple[int, ...]) -> float:
        """Interpolated log(measured / fitted roofline) at ``key`` (clamped to the grid's range)."""
        corners: list[list[tuple[int, float]]] = []  # per axis: (position on the axis, weight)
        for x, axis in zip(key, self._axes, strict=True):
            j = int(np.searchsorted(axis, x))
            if j < len(axis) and axis[j] == x or j == 0:
                corners.append([(min(j, len(axis) - 1), 1.0)])
            elif j == len(axis):
                corners.append([(len(axis) - 1, 1.0)])
            else:
                lo, hi = float(axis[j - 1]), float(axis[j])
                w = (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))
                corners.append([(j - 1, 1 - w), (j, w)])
        sizes = [len(a) for a in self._axes]
        total = acc = 0.0
        for combo in np.ndindex(*(len(c) for c in corners)):
            w = math.prod(corners[a][i][1] for a, i in enumerate(combo))
            code = 0
            for a, i in enumerate(combo):
                code = code * sizes[a] + corners[a][i][0]
            row = self._index.get(code)
            if row is not None and w > 0:
                total += w
                acc += w * self._log_ratio[row]
        if total > 1e-9:
            return acc / total
        dist = np.abs(self._log_points - np.log(np.maximum(np.array(key, dtype=float), 1))).sum(axis=1)
        return float(self._log_ratio[int(np.argmin(dist))])

    def time_at(self, key: tuple[int, ...], *, kv_len: int | None = None) -> float:
        """Seconds at ``key``: the fitted roofline there times the interpolated ratio."""
        q = None if kv_len is None else np.array([float(kv_len)])
        return float(self.roofline_s(np.array([key]), kv_len=q)[0]) * math.exp(self.log_ratio(key))


def monotone_in_tokens(points: np.ndarray, time_s: np.ndarray) -> np.ndarray:
    """MoE times repaired to be non-decreasing in tokens (``points[:, 0]``) per model shape (the other
    columns): each time becomes the least time measured at that token count or more,
    t'(n) = min over n' >= n of t(n').
    A kernel on fewer tokens can run the configuration chosen for more (the extra rows padded), so the larger
    count's time bounds the smaller's; measured points only ever go down, and only where the data break the
    order (docs/cost.md lists them)."""
    order = np.lexsort((-points[:, 0], *points[:, 1:].T[::-1]))  # by shape, tokens descending
    out = time_s.astype(float).copy()
    shape = points[order, 1:]
    start = np.flatnonzero(np.r_[True, (shape[1:] != shape[:-1]).any(axis=1)])
    for lo, hi in zip(start, [*start[1:], len(order)], strict=True):
        rows = order[lo:hi]
        out[rows] = np.minimum.accumulate(out[rows])  # largest token count first: running minimum from above
    return out


def read_table(path: Path, name: str, gpu: GpuSpec) -> MeasuredTable:
    """One CSV table, MoE times repaired by ``monotone_in_tokens``; a malformed row is a UserError naming file
    and row (1 = the first data row)."""
    points, time_s = read_rows(path, name)
    if name in MOE_TABLES:
        time_s = monotone_in_tokens(points, time_s)
    return MeasuredTable(name=name, gpu=gpu, points=points, time_s=time_s,
                         cache=TABLE_CACHE.get(name, DEFAULT_CACHE))


def read_rows(path: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(shapes [N, d], seconds [N]) of one CSV table as measured.

    numpy parses a clean file at once; any failure re-reads it row by row to name the bad row."""
    keys = KEYS[name]
    try:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        if header != [*keys, "latency_ms"]:
            raise UserError(f"{path}: header {','.join(header)!r} is not {','.join([*keys, 'latency_ms'])!r}")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy warns on an empty file: found below
            data = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
        if data.shape[1] != len(keys) + 1 or not (data > 0).all() or not np.isfinite(data).all() \
                or (data[:, :-1] != np.round(data[:, :-1])).any():
            raise ValueError("bad values")
    except OSError as e:
        raise UserError(f"cannot read table {path}: {e.strerror}") from None
    except (ValueError, UserWarning):
        _find_bad_row(path, len(keys))
        raise UserError(f"{path}: no rows") from None
    return data[:, :-1].astype(np.int64), data[:, -1] * 1e-3


def _find_bad_row(path: Path, nkeys: int) -> None:
    """Raise a UserError naming the first malformed data row of ``path``; return if every row is fine."""
    with path.open(newline="") as f:
        reader = csv.reader(f)
        next(reader, None)
        for i, row in enumerate(reader, start=1):
            try:
                if len(row) != nkeys + 1:
                    raise ValueError(f"{len(row)} fields, expected {nkeys + 1}")
                vals = [int(x) for x in row[:-1]]
                t = float(row[-1])
                if min(vals) <= 0 or not t > 0 or math.isinf(t):
                    raise ValueError("shape values and latency must be > 0")
            except ValueError as e:
                raise UserError(f"{path}: row {i}: malformed ({e}): {','.join(row)}") from None


def load_gpu_tables(gpu_dir: Path, gpu: GpuSpec) -> dict[str, MeasuredTable]:
    return {name: read_table(gpu_dir / f"{name}.csv", name, gpu) for name in TABLES
            if (gpu_dir / f"{name}.csv").exists()}


def table_dirs(root: Path = SHIPPED_AIC) -> dict[str, Path]:
    """Catalog GPU name -> its table directory, for every directory under ``root`` with a table."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"table directory {root} does not exist")
    out = {resolve_gpu(p.name): p for p in sorted(root.iterdir())
           if p.is_dir() and any((p / f"{n}.csv").exists() for n in TABLES)}
    if not out:
        raise UserError(f"no <gpu>/<table>.csv tables under {root}; tables: {', '.join(TABLES)}")
    return out
