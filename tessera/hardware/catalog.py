"""GPU and link specs as data (data/gpus.toml), behind one registry whose errors list the valid names."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from tessera.errors import choices_error

DATA = Path(__file__).parent / "data" / "gpus.toml"


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    name: str
    vendor: str
    peak_flops_per_s: dict[str, float] = field(hash=False)  # dtype -> dense FLOP/s
    mem_bw_bytes_per_s: float
    mem_bytes: int
    sms: int
    l2_bytes: int
    power_w: float
    nvlink_bytes_per_s: float
    pcie_gen: int
    usd_per_hour: float
    price_date: str = ""
    price_source: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if self.mem_bw_bytes_per_s <= 0 or self.mem_bytes <= 0:
            raise ValueError(f"gpu {self.name}: memory bandwidth and capacity must be > 0")
        if not self.peak_flops_per_s:
            raise ValueError(f"gpu {self.name}: peak_flops_per_s is empty")

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for a dtype; falls back bf16 -> fp16 -> fp32."""
        key = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8"}.get(dtype, dtype)
        for k in (key, "bf16", "fp16", "fp32"):
            if k in self.peak_flops_per_s:
                return self.peak_flops_per_s[k]
        raise AssertionError("unreachable: peak_flops_per_s non-empty")


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    name: str
    bytes_per_s: float  # per direction
    latency_s: float
    source: str = ""


@cache
def _load(path: Path = DATA) -> tuple[dict[str, GpuSpec], dict[str, LinkSpec]]:
    raw = tomllib.loads(path.read_text())
    gpus = {n: GpuSpec(name=n, **v) for n, v in raw.get("gpu", {}).items()}
    links = {n: LinkSpec(name=n, **v) for n, v in raw.get("link", {}).items()}
    return gpus, links


def gpu_names() -> list[str]:
    return sorted(_load()[0])


def link_names() -> list[str]:
    return sorted(_load()[1])


def gpu(name: str) -> GpuSpec:
    gpus = _load()[0]
    if name not in gpus:
        raise choices_error("GPU", name, list(gpus))
    return gpus[name]


def link(name: str) -> LinkSpec:
    links = _load()[1]
    if name not in links:
        raise choices_error("link", name, list(links))
    return links[name]
