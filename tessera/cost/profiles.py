"""Measured per-operator tables in Vidur's format: ``<dir>/<gpu>/<model>/mlp.csv``.

Each row of mlp.csv is one (model shape, num_tokens, tensor-parallel degree) with
``time_stats.<op>.median`` in milliseconds. Rows can repeat a shape: we take the median of the
medians. Every operator becomes a synthetic ``Kernel`` with the shape Vidur ran (so the roofline
can be fitted and checked against it), and the GEMM operators become tables keyed by (n, k) over
m = num_tokens, which override the roofline for captured GEMMs of the same shape.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tessera.errors import UserError
from tessera.graph import Kernel, KernelKind
from tessera.hardware import resolve_gpu

SHIPPED = Path(__file__).parent / "data" / "vidur"
OPS: tuple[str, ...] = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
                        "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
GEMM_OPS: tuple[str, ...] = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
OP_KIND: dict[str, KernelKind] = {
    "emb": KernelKind.EMBEDDING, "input_layernorm": KernelKind.NORM, "post_attention_layernorm": KernelKind.NORM,
    "attn_rope": KernelKind.ELEMENTWISE, "mlp_act": KernelKind.ELEMENTWISE, "add": KernelKind.ELEMENTWISE,
    **{op: KernelKind.GEMM for op in GEMM_OPS},
}
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "num_tokens",
                 "num_tensor_parallel_workers")
DTYPE = "float16"  # Vidur profiles in fp16
ELEM_BYTES = 2


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    heads: int
    kv_heads: int
    hidden: int
    ffn: int
    gated: bool
    tp: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One measured operator: its GPU (catalog name), model, op, tokens and median time."""

    gpu: str
    model: str
    op: str
    tokens: int
    time_s: float
    kernel: Kernel = field(compare=False)


def gemm_dims(op: str, s: ModelShape) -> tuple[int, int]:
    """(n, k) of an operator's GEMM (y[m, n] = x[m, k] @ W[k, n]) for a tp-sharded Llama layer."""
    qkv = (s.heads + 2 * s.kv_heads) * s.head_dim
    up = (2 if s.gated else 1) * s.ffn
    return {"attn_pre_proj": (qkv // s.tp, s.hidden), "attn_post_proj": (s.hidden, s.hidden // s.tp),
            "mlp_up_proj": (up // s.tp, s.hidden), "mlp_down_proj": (s.hidden, s.ffn // s.tp)}[op]


def op_kernel(op: str, s: ModelShape, tokens: int) -> Kernel:
    """The kernel Vidur timed for ``op``: FLOPs and bytes moved (fp16) at this shape."""
    t, h, e = tokens, s.hidden, ELEM_BYTES
    if op in GEMM_OPS:
        n, k = gemm_dims(op, s)
        return Kernel(id=0, name=op, kind=KernelKind.GEMM, flops=2 * t * n * k, bytes_read=(t * k + k * n) * e,
                      bytes_written=t * n * e, reads=(), writes=(), dtype=DTYPE, dims={"m": t, "n": n, "k": k})
    if op == "emb":  # gather t rows of the table + int64 ids
        rd, wr, numel = t * h * e + 8 * t, t * h * e, t * h
    elif op in ("input_layernorm", "post_attention_layernorm"):
        rd, wr, numel = (t * h + h) * e, t * h * e, t * h
    elif op == "attn_rope":  # rotate q and k in place, cos/sin rows per token
        numel = t * (s.heads + s.kv_heads) // s.tp * s.head_dim
        rd, wr = numel * e + 2 * t * s.head_dim * e, numel * e
    elif op == "mlp_act":  # silu(gate) * up
        numel = t * s.ffn // s.tp
        rd, wr = 2 * numel * e, numel * e
    elif op == "add":
        rd, wr, numel = 2 * t * h * e, t * h * e, t * h
    else:
        raise UserError(f"unknown profile operator {op!r}; valid: {', '.join(OPS)}")
    # flops 0 as torch's FLOP counter (and so capture) reports for non-matmul operators
    return Kernel(id=0, name=op, kind=OP_KIND[op], flops=0, bytes_read=rd, bytes_written=wr, reads=(),
                  writes=(), dtype=DTYPE, dims={"numel": numel})


def read_mlp_csv(path: Path, *, gpu: str, model: str, tp: int | None = 1) -> list[Sample]:
    """Samples of one mlp.csv (rows at tensor-parallel degree ``tp``; None: all), median of medians."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise UserError(f"cannot read profile {path}: {e.strerror}") from None
    if not rows or any(c not in rows[0] for c in SHAPE_COLUMNS):
        raise UserError(f"profile {path} is not a Vidur mlp.csv: needs columns {', '.join(SHAPE_COLUMNS)}")
    groups: dict[tuple[ModelShape, int, str], list[float]] = defaultdict(list)
    for r in rows:
        try:
            shape = ModelShape(heads=int(r["n_head"]), kv_heads=int(r["n_kv_head"]), hidden=int(r["n_embd"]),
                               ffn=int(r["n_expanded_embd"]), gated=r.get("use_gated_mlp", "True") == "True",
                               tp=int(r["num_tensor_parallel_workers"]))
            tokens = int(r["num_tokens"])
        except ValueError as e:
            raise UserError(f"profile {path}: bad shape value ({e})") from None
        if tp is not None and shape.tp != tp:
            continue
        for op in OPS:
            v = r.get(f"time_stats.{op}.median", "")
            if v not in ("", "nan"):
                groups[(shape, tokens, op)].append(float(v) * 1e-3)  # ms -> s
    return [Sample(gpu=gpu, model=model, op=op, tokens=t, time_s=statistics.median(v),
                   kernel=op_kernel(op, s, t)) for (s, t, op), v in sorted(groups.items(), key=_order)]


def _order(item: tuple[tuple[ModelShape, int, str], list[float]]) -> tuple[str, int, int]:
    (s, t, op), _ = item
    return (op, s.hidden * 1_000_000 + s.ffn, t)


def load_profiles(root: str | Path = SHIPPED, *, tp: int | None = 1) -> dict[str, list[Sample]]:
    """All samples under ``root/<gpu>/<model>/mlp.csv``, keyed by catalog GPU name.

    A GPU directory name is resolved through the catalog (aliases such as a100 -> A100-80GB-SXM);
    an unknown one is an error listing the valid names.
    """
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"profile directory {root} does not exist")
    out: dict[str, list[Sample]] = {}
    for gpu_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "network"):
        files = sorted(gpu_dir.glob("*/mlp.csv"))
        if not files:
            continue
        name = resolve_gpu(gpu_dir.name)
        for f in files:
            out.setdefault(name, []).extend(read_mlp_csv(f, gpu=name, model=f.parent.name, tp=tp))
    if not out:
        raise UserError(f"no <gpu>/<model>/mlp.csv profiles under {root}")
    return out


@dataclass(frozen=True, kw_only=True)
class GemmTable:
    """Measured GEMM times of one GPU: (n, k) -> sorted token counts m and seconds."""

    shapes: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = field(hash=False)

    @classmethod
    def from_samples(cls, samples: list[Sample]) -> GemmTable:
        acc: dict[tuple[int, int], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for s in samples:
            if s.kernel.kind is KernelKind.GEMM:
                acc[(s.kernel.dims["n"], s.kernel.dims["k"])][s.tokens].append(s.time_s)
        shapes = {}
        for nk, by_m in acc.items():
            ms = sorted(by_m)
            shapes[nk] = (np.array(ms, dtype=float), np.array([statistics.median(by_m[m]) for m in ms]))
        return cls(shapes=shapes)

    def lookup(self, m: int, n: int, k: int) -> tuple[float, float] | None:
        """(time_s, m_clamped): measured time at the nearest covered m, interpolated linearly in m.

        m outside the measured range is clamped; the caller scales by its roofline ratio. None when
        no table has this (n, k).
        """
        tab = self.shapes.get((n, k))
        if tab is None:
            return None
        ms, ts = tab
        mc = float(min(max(m, ms[0]), ms[-1]))
        return float(np.interp(mc, ms, ts)), mc


# ---- per-kernel timings (`tessera profile`: <dir>/cpu/<model>/kernels.csv) ----------------------------

KERNEL_COLUMNS = ("model", "phase", "tokens", "id", "name", "kind", "module", "dims", "flops", "bytes_read",
                  "bytes_written", "dtype", "time_s")


@dataclass(frozen=True, kw_only=True)
class KernelTiming:
    model: str
    phase: str
    tokens: int
    kernel: Kernel
    time_s: float


def read_kernels(path: Path) -> list[KernelTiming]:
    with path.open(newline="") as f:
        return [KernelTiming(model=r["model"], phase=r["phase"], tokens=int(r["tokens"]), time_s=float(r["time_s"]),
                             kernel=Kernel(id=int(r["id"]), name=r["name"], kind=KernelKind(r["kind"]),
                                           module=r["module"], dims=json.loads(r["dims"]), flops=int(r["flops"]),
                                           bytes_read=int(r["bytes_read"]), bytes_written=int(r["bytes_written"]),
                                           reads=(), writes=(), dtype=r["dtype"]))
                for r in csv.DictReader(f)]
