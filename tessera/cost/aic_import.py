"""`tessera cost import aic`: NVIDIA AIConfigurator's measured kernel tables -> the compact CSVs the cost
model reads.

aiconfigurator-core (Apache-2.0) ships parquet tables under
``aiconfigurator_core/systems/data/<system>/<op family>/<framework>/<version>/<op>_perf.parquet``, latency
in milliseconds. We keep the vLLM backend's rows the default models need, newest vLLM version per table, one
kernel implementation per table (the one with the most rows: vLLM's default on that GPU):

  gemm.csv                  m, n, k, latency_ms           (torch.nn.functional.linear, bf16)
  gemm_fp8.csv              m, n, k, latency_ms           (fp8 weights and activations, CUTLASS scaled_mm)
  context_attention.csv     batch, isl, heads, kv_heads, head_dim, latency_ms   (bf16 KV, no window)
  generation_attention.csv  batch, kv_len, heads, kv_heads, head_dim, latency_ms (kv_len = isl + step)
  moe.csv                   tokens, hidden, inter, topk, experts, latency_ms    (bf16, EP1, balanced)
  moe_fp8_block.csv         the same with fp8 expert weights in 128x128 scale blocks
  moe_power_law.csv         bf16 MoE under power-law routing (exponent 1.2)

MoE rows of every tensor-parallel degree are kept as the one GPU's kernel they time, inter = inter_size / TP
(vLLM splits each expert's intermediate dimension); expert-parallel rows (EP > 1) are not kept.

fp8 GEMMs come from the per-tensor rows (gemm_dtype fp8), not the block-scaled ones (fp8_block): each
fp8_block row carries a floor of host time per call (55-90 us on Hopper, 150-500 us on Blackwell, ~300 us on
L40S: vLLM's eager block-scaled path, which CUDA graphs remove when serving), and where a block-scaled time
clears twice that floor it matches the per-tensor time (docs/cost.md gives the figures).

Reading parquet needs pyarrow, which aiconfigurator-core depends on (``pip install 'tessera[aic]'``).
"""

from __future__ import annotations

import csv
import importlib.util
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tessera.errors import UserError

FRAMEWORK = "vllm"
# MoE rows at every tensor-parallel degree, as the one GPU's kernel they time: each expert's intermediate
# dimension split TP ways (vLLM's fused_moe under TP), so inter = inter_size / moe_tp_size
MOE_WHERE = {"moe_ep_size": 1}
MOE_KEEP = {"tokens": "num_tokens", "hidden": "hidden_size", "inter": "inter_size/moe_tp_size", "topk": "topk",
            "experts": "num_experts"}
GEMM_KEEP = {"m": "m", "n": "n", "k": "k"}
ATTN_WHERE = {"attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "window_size": 0}


@dataclass(frozen=True, kw_only=True)
class TableSpec:
    """Where one table's rows come from: ``family``/vllm/<version>/``filename``, the rows whose columns equal
    ``where``, our columns from theirs (``keep``; "a+b" sums two, "a/b" divides), one kernel implementation
    (the one with the most rows)."""

    family: str
    filename: str
    where: dict[str, Any] = field(hash=False)
    keep: dict[str, str] = field(hash=False)

    def __post_init__(self) -> None:
        if not self.keep or not self.filename.endswith(".parquet"):
            raise ValueError(f"table spec {self.family}/{self.filename}: needs columns to keep and a parquet file")


SPECS: dict[str, TableSpec] = {
    "gemm": TableSpec(family="gemm", filename="gemm_perf.parquet", where={"gemm_dtype": "bfloat16"},
                      keep=GEMM_KEEP),
    "context_attention": TableSpec(
        family="attention", filename="context_attention_perf.parquet", where=ATTN_WHERE,
        keep={"batch": "batch_size", "isl": "isl", "heads": "num_heads", "kv_heads": "num_key_value_heads",
              "head_dim": "head_dim"}),
    "generation_attention": TableSpec(
        family="attention", filename="generation_attention_perf.parquet", where=ATTN_WHERE,
        keep={"batch": "batch_size", "kv_len": "isl+step", "heads": "num_heads",
              "kv_heads": "num_key_value_heads", "head_dim": "head_dim"}),
    "moe": TableSpec(family="moe", filename="moe_perf.parquet",
                     where={**MOE_WHERE, "moe_dtype": "bfloat16", "distribution": "balanced"}, keep=MOE_KEEP),
    # the same kernels under power-law routing (exponent 1.2): the only MoE rows AIConfigurator has for A100
    # and the Arc Pro B60, from which their balanced times are derived (tessera.cost.moe)
    "moe_power_law": TableSpec(family="moe", filename="moe_perf.parquet",
                               where={**MOE_WHERE, "moe_dtype": "bfloat16", "distribution": "power_law_1.2"},
                               keep=MOE_KEEP),
    # fp8 checkpoints (DeepSeek-V3, Qwen3 FP8): GEMMs from the per-tensor rows (module doc), MoE from the
    # block-scaled ones (their times are the GPU's: floors of 20-30 us, as bf16 MoE's)
    "gemm_fp8": TableSpec(family="gemm", filename="gemm_perf.parquet", where={"gemm_dtype": "fp8"}, keep=GEMM_KEEP),
    "moe_fp8_block": TableSpec(family="moe", filename="moe_perf.parquet",
                               where={**MOE_WHERE, "moe_dtype": "fp8_block", "distribution": "balanced"},
                               keep=MOE_KEEP),
}
TABLES: tuple[str, ...] = tuple(SPECS)


def package_data_dir() -> Path:
    """``systems/data`` of the installed aiconfigurator-core, or a UserError saying how to install it."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("aiconfigurator-core is not installed; install it with: pip install 'tessera[aic]' "
                        "(or pip install aiconfigurator-core==0.12.0)")
    return Path(next(iter(spec.submodule_search_locations))) / "systems" / "data"


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in v.replace("rc", ".").split("."))


def newest(system_dir: Path, family: str, filename: str) -> Path | None:
    """The table of the newest vLLM version that has ``filename``, or None."""
    found = sorted(system_dir.glob(f"{family}/{FRAMEWORK}/*/{filename}"), key=lambda p: _version_key(p.parent.name))
    return found[-1] if found else None


def select_rows(cols: dict[str, list[Any]], name: str) -> tuple[str, list[list[float]]]:
    """(kernel source kept, rows of our columns + latency_ms) from one parquet table's columns.

    A filter column the table lacks counts as its default (older tables have no window_size)."""
    spec = SPECS[name]
    n = len(cols["latency"])
    ok = [all(cols[c][i] == v for c, v in spec.where.items() if c in cols) for i in range(n)]
    sources = Counter(cols["kernel_source"][i] for i in range(n) if ok[i])
    if not sources:
        return "", []
    source = sources.most_common(1)[0][0]

    def value(col: str, i: int) -> float:
        if "/" in col:
            a, b = col.split("/")
            return cols[a][i] / cols[b][i]
        return sum(cols[c][i] for c in col.split("+"))

    rows = {}
    for i in range(n):
        if ok[i] and cols["kernel_source"][i] == source:
            key = tuple(int(value(c, i)) for c in spec.keep.values())
            rows[key] = float(cols["latency"][i])  # a repeated shape: the later measurement wins
    return source, [[*k, t] for k, t in sorted(rows.items())]


def write_table(path: Path, name: str, rows: list[list[float]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*SPECS[name].keep, "latency_ms"])
        for r in rows:
            w.writerow([*(int(x) for x in r[:-1]), f"{r[-1]:.5g}"])


def import_aic(out: Path, *, systems: list[str] | None = None) -> dict[str, dict[str, str]]:
    """Write ``out/<system>/<table>.csv`` for every system with vLLM tables; returns, per system and
    table, the source file and kernel it came from (also written to ``out/<system>/SOURCE.csv``)."""
    pq = _pq()
    data = package_data_dir()
    available = sorted(p.name for p in data.iterdir() if p.is_dir() and any(p.glob(f"*/{FRAMEWORK}/*/*.parquet")))
    chosen = systems or available
    unknown = [s for s in chosen if s not in available]
    if unknown:
        raise UserError(f"aiconfigurator-core has no vLLM tables for {', '.join(unknown)}; "
                        f"valid: {', '.join(available)}")
    report: dict[str, dict[str, str]] = {}
    for system in chosen:
        (out / system).mkdir(parents=True, exist_ok=True)
        report[system] = {}
        for name, spec in SPECS.items():
            src = newest(data / system, spec.family, spec.filename)
            if src is None:
                continue
            kernel, rows = select_rows(pq.read_table(src).to_pydict(), name)
            if rows:
                write_table(out / system / f"{name}.csv", name, rows)
                report[system][name] = f"{src.relative_to(data)} [{kernel}] {len(rows)} rows"
        with (out / system / "SOURCE.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["table", "source"])
            w.writerows(sorted(report[system].items()))
    return report


def _pq():  # noqa: ANN202 - pyarrow.parquet, or a UserError saying how to install it
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("reading aiconfigurator-core's parquet tables needs pyarrow: "
                        "pip install 'tessera[aic]'") from None
    return pq


FLOOR_PERCENTILE = 5  # a kernel's host floor: this percentile of its latencies over the whole table
CLEARS_FLOOR = 2.0  # a block-scaled time this many floors or more is the GPU's, not the host's


def block_scaled_gemm_check() -> dict[str, dict[str, Any]]:
    """Why fp8 GEMMs are priced from the per-tensor rows (module doc), per system with fp8_block GEMM rows:
    each block-scaled kernel's host floor (ms) and share of rows under ``CLEARS_FLOOR`` floors, and the
    block-scaled / per-tensor time ratio at the shapes whose block-scaled time clears it (median, p10, p90)."""
    pq = _pq()
    data = package_data_dir()
    out: dict[str, dict[str, Any]] = {}
    for system in sorted(p.name for p in data.iterdir() if p.is_dir()):
        src = newest(data / system, "gemm", "gemm_perf.parquet")
        if src is None:
            continue
        cols = pq.read_table(src).to_pydict()
        by: dict[str, dict[tuple[int, int, int], tuple[str, float]]] = {"fp8": {}, "fp8_block": {}}
        for i, dtype in enumerate(cols["gemm_dtype"]):
            if dtype in by:
                by[dtype][(cols["m"][i], cols["n"][i], cols["k"][i])] = (cols["kernel_source"][i], cols["latency"][i])
        if len(by["fp8_block"]) < 1000:  # RTX PRO 6000: 518 rows, n and k <= 128 only
            continue
        kernels = sorted({k for k, _ in by["fp8_block"].values()})
        floor = {k: float(np.percentile([t for kk, t in by["fp8_block"].values() if kk == k], FLOOR_PERCENTILE))
                 for k in kernels}
        clear = {s: t for s, (k, t) in by["fp8_block"].items() if t >= CLEARS_FLOOR * floor[k]}
        ratio = np.array([t / by["fp8"][s][1] for s, t in clear.items() if s in by["fp8"]])
        out[system] = {"source": str(src.relative_to(data)), "rows": len(by["fp8_block"]),
                       "floor_ms": {k: round(v, 4) for k, v in floor.items()},
                       "under_floor_share": round(1 - len(clear) / len(by["fp8_block"]), 3),
                       "ratio_where_clear": {"median": round(float(np.median(ratio)), 3),
                                             "p10": round(float(np.percentile(ratio, 10)), 3),
                                             "p90": round(float(np.percentile(ratio, 90)), 3),
                                             "points": len(ratio)}}
    return out
