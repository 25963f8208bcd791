"""Link latency and efficiency from Vidur's point-to-point measurements (network/<node>/send_recv.csv)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from tessera.cost.profiles import SHIPPED
from tessera.errors import UserError

NVLINK_SEND_RECV = SHIPPED / "network" / "h100_pairwise_nvlink" / "send_recv.csv"


def fit_send_recv(path: Path = NVLINK_SEND_RECV, *, devices_per_node: int = 2) -> tuple[float, float]:
    """(latency_s, bytes_per_s) of time = latency + size / bandwidth, least squares over the rows
    with both workers on one node (devices_per_node=2: the NVLink path; 1 is across nodes)."""
    try:
        with path.open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if int(r["devices_per_node"]) == devices_per_node]
    except (OSError, KeyError, ValueError) as e:
        raise UserError(f"cannot read send_recv profile {path}: {e}") from None
    if len(rows) < 2:
        raise UserError(f"send_recv profile {path} has {len(rows)} rows with devices_per_node={devices_per_node}")
    size = np.array([float(r["size"]) for r in rows])
    time_s = np.array([float(r["time_stats.send_recv.median"]) * 1e-3 for r in rows])  # ms -> s
    latency_s, s_per_byte = np.linalg.lstsq(np.stack([np.ones_like(size), size], 1), time_s, rcond=None)[0]
    return float(latency_s), float(1.0 / s_per_byte)
