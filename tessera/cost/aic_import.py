"""`tessera cost import aic`: NVIDIA AIConfigurator's measured kernel tables -> the compact CSVs the cost
model reads.

aiconfigurator-core (Apache-2.0) ships parquet tables under
``aiconfigurator_core/systems/data/<system>/<op family>/<framework>/<version>/<op>_perf.parquet``, latency
in milliseconds. We keep the vLLM backend's bf16 rows the default models need, newest vLLM version per
table, one kernel implementation per table (the one with the most rows: vLLM's default on that GPU):

  gemm.csv                  m, n, k, latency_ms           (torch.nn.functional.linear, bf16)
  context_attention.csv     batch, isl, heads, kv_heads, head_dim, latency_ms   (bf16 KV, no window)
  generation_attention.csv  batch, kv_len, heads, kv_heads, head_dim, latency_ms (kv_len = isl + step)
  moe.csv                   tokens, hidden, inter, topk, experts, latency_ms    (bf16, TP1 EP1, balanced)
  moe_power_law.csv         the same under power-law routing (exponent 1.2)

Reading parquet needs pyarrow, which aiconfigurator-core depends on (``pip install 'tessera[aic]'``).
"""

from __future__ import annotations

import csv
import importlib.util
from collections import Counter
from pathlib import Path
from typing import Any

from tessera.errors import UserError

FRAMEWORK = "vllm"
MOE_WHERE = {"moe_dtype": "bfloat16", "moe_tp_size": 1, "moe_ep_size": 1}
MOE_KEEP = {"tokens": "num_tokens", "hidden": "hidden_size", "inter": "inter_size", "topk": "topk",
            "experts": "num_experts"}
# table name -> (op family directory, parquet file, {column: required value}, {our column: their column})
SPECS: dict[str, tuple[str, str, dict[str, Any], dict[str, str]]] = {
    "gemm": ("gemm", "gemm_perf.parquet", {"gemm_dtype": "bfloat16"}, {"m": "m", "n": "n", "k": "k"}),
    "context_attention": (
        "attention", "context_attention_perf.parquet",
        {"attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "window_size": 0},
        {"batch": "batch_size", "isl": "isl", "heads": "num_heads", "kv_heads": "num_key_value_heads",
         "head_dim": "head_dim"}),
    "generation_attention": (
        "attention", "generation_attention_perf.parquet",
        {"attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "window_size": 0},
        {"batch": "batch_size", "kv_len": "isl+step", "heads": "num_heads", "kv_heads": "num_key_value_heads",
         "head_dim": "head_dim"}),
    "moe": ("moe", "moe_perf.parquet", {**MOE_WHERE, "distribution": "balanced"}, MOE_KEEP),
    # the same kernels under power-law routing (exponent 1.2): the only MoE rows AIConfigurator has for A100
    # and the Arc Pro B60, from which their balanced times are derived (tessera.cost.moe)
    "moe_power_law": ("moe", "moe_perf.parquet", {**MOE_WHERE, "distribution": "power_law_1.2"}, MOE_KEEP),
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
    _, _, where, keep = SPECS[name]
    n = len(cols["latency"])
    ok = [all(cols[c][i] == v for c, v in where.items() if c in cols) for i in range(n)]
    sources = Counter(cols["kernel_source"][i] for i in range(n) if ok[i])
    if not sources:
        return "", []
    source = sources.most_common(1)[0][0]

    def value(col: str, i: int) -> float:
        return sum(cols[c][i] for c in col.split("+"))

    rows = {}
    for i in range(n):
        if ok[i] and cols["kernel_source"][i] == source:
            key = tuple(int(value(c, i)) for c in keep.values())
            rows[key] = float(cols["latency"][i])  # a repeated shape: the later measurement wins
    return source, [[*k, t] for k, t in sorted(rows.items())]


def write_table(path: Path, name: str, rows: list[list[float]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*SPECS[name][3], "latency_ms"])
        for r in rows:
            w.writerow([*(int(x) for x in r[:-1]), f"{r[-1]:.5g}"])


def import_aic(out: Path, *, systems: list[str] | None = None) -> dict[str, dict[str, str]]:
    """Write ``out/<system>/<table>.csv`` for every system with vLLM tables; returns, per system and
    table, the source file and kernel it came from (also written to ``out/<system>/SOURCE.csv``)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("reading aiconfigurator-core's parquet tables needs pyarrow: "
                        "pip install 'tessera[aic]'") from None
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
        for name, (family, filename, _, _) in SPECS.items():
            src = newest(data / system, family, filename)
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
