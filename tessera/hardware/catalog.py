"""GPU and link specs as data (data/gpus.toml), behind one registry whose errors list the valid names.

A user file with the same schema (path in the ``TESSERA_CATALOG`` environment variable, or passed to
``use_catalog``) adds GPU types or links and overrides fields of shipped ones (a price, typically):
a ``[gpu.NAME]`` table for an existing NAME only needs the keys it changes.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

from tessera.errors import UserError, choices_error, os_error_text

DATA = Path(__file__).parent / "data" / "gpus.toml"
ENV_VAR = "TESSERA_CATALOG"
LINK_KINDS = ("nvlink", "pcie", "network")
_DTYPE_KEYS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8",
               "float8_e5m2": "fp8"}


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    name: str
    vendor: str
    peak_flops_per_s: dict[str, float] = field(hash=False)  # dtype key (fp32, tf32, bf16, fp16, fp8) -> dense
    mem_bw_bytes_per_s: float
    mem_bytes: int
    sms: int  # streaming multiprocessors (NVIDIA) / compute units (AMD) / cores (cpu)
    l2_bytes: int
    power_w: float
    nvlink_bytes_per_s: float  # datasheet total, both directions; 0: none
    pcie_gen: int
    usd_per_hour: float
    nvlink_gen: int = 0
    nvlink_domain_gpus: int = 0  # most GPUs one NVLink domain joins (HGX board 8, NVL72 72, bridge 2)
    measured: bool = False  # figures measured on this machine rather than read off a datasheet
    memory_type: str = ""  # HBM3e, GDDR6, ...: a feature the cost model's transfer to unmeasured GPUs uses
    boost_clock_hz: float = 0.0  # max boost clock (datasheet); 0: not given. The transfer scales launch floors by it
    price_date: str = ""
    price_source: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if self.mem_bw_bytes_per_s <= 0 or self.mem_bytes <= 0:
            raise ValueError(f"gpu {self.name}: memory bandwidth and capacity must be > 0, got "
                             f"{self.mem_bw_bytes_per_s} B/s, {self.mem_bytes} B")
        if not self.peak_flops_per_s:
            raise ValueError(f"gpu {self.name}: peak_flops_per_s is empty")
        bad = {k: v for k, v in self.peak_flops_per_s.items() if v <= 0}
        if bad:
            raise ValueError(f"gpu {self.name}: peak FLOP/s must be > 0, got {bad}")
        if self.sms <= 0:
            raise ValueError(f"gpu {self.name}: sms={self.sms} must be > 0")
        if self.boost_clock_hz < 0:
            raise ValueError(f"gpu {self.name}: boost_clock_hz={self.boost_clock_hz} must be >= 0 (0: not given)")
        if self.usd_per_hour < 0:
            raise ValueError(f"gpu {self.name}: usd_per_hour={self.usd_per_hour} must be >= 0")
        if (self.nvlink_gen > 0 and self.nvlink_domain_gpus < 2) or self.nvlink_domain_gpus < 0:
            raise ValueError(f"gpu {self.name}: nvlink_gen={self.nvlink_gen} needs nvlink_domain_gpus >= 2 "
                             f"(the most GPUs one NVLink domain joins: 8 on an HGX board, 2 for a bridged "
                             f"pair), got {self.nvlink_domain_gpus}")
        if self.pcie_gen < 0:
            raise ValueError(f"gpu {self.name}: pcie_gen={self.pcie_gen} must be >= 0 (0: the host, no PCIe)")

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for a dtype; falls back bf16 -> fp16 -> fp32."""
        key = _DTYPE_KEYS.get(dtype, dtype)
        for k in (key, "bf16", "fp16", "fp32"):
            if k in self.peak_flops_per_s:
                return self.peak_flops_per_s[k]
        return max(self.peak_flops_per_s.values())


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    name: str
    bytes_per_s: float  # per direction, datasheet peak
    latency_s: float
    efficiency: float = 1.0  # fraction of bytes_per_s a large transfer reaches
    kind: str = "network"  # nvlink | pcie | network: which cells can have it (tessera.hardware.links)
    generation: int = 0  # NVLink or PCIe generation; 0 for a network link
    source: str = ""

    def __post_init__(self) -> None:
        if self.bytes_per_s <= 0 or self.latency_s < 0:
            raise ValueError(f"link {self.name}: bytes_per_s={self.bytes_per_s} must be > 0 and "
                             f"latency_s={self.latency_s} >= 0")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"link {self.name}: efficiency={self.efficiency} must be in (0, 1]")
        if self.kind not in LINK_KINDS:
            raise ValueError(f"link {self.name}: kind={self.kind!r}; valid: {', '.join(LINK_KINDS)}")
        if (self.kind == "network") != (self.generation == 0) or self.generation < 0:
            raise ValueError(f"link {self.name}: an nvlink or pcie link needs its generation >= 1, a network "
                             f"link none; got kind={self.kind!r}, generation={self.generation}")

    @property
    def effective_bytes_per_s(self) -> float:
        """What a large transfer reaches (B/s per direction)."""
        return self.bytes_per_s * self.efficiency


@dataclass(frozen=True, kw_only=True)
class Catalog:
    gpus: dict[str, GpuSpec] = field(hash=False)
    links: dict[str, LinkSpec] = field(hash=False)
    aliases: dict[str, str] = field(hash=False)  # lower-case directory name -> catalog GPU name


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except OSError as e:
        raise UserError(f"cannot read catalog file {path}: {os_error_text(e)}") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"catalog file {path} is not valid TOML: {e}") from None


def _build(cls: type, name: str, values: dict[str, Any], path: Path) -> Any:
    known = {f.name for f in fields(cls)} - {"name"}
    extra = sorted(set(values) - known)
    if extra:
        raise UserError(f"{path}: {name}: unknown key(s) {', '.join(extra)}; valid: {', '.join(sorted(known))}")
    try:
        return cls(name=name, **values)
    except TypeError as e:  # a missing required key
        raise UserError(f"{path}: {name}: {e}") from None


def _section(raw: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    """One top-level table of a catalog file; ``[[gpu]]`` (an array of tables) is the pool file's form."""
    value = raw.get(key, {})
    if not isinstance(value, dict):
        form = f"an array of tables [[{key}]]" if isinstance(value, list) else f"a {type(value).__name__}"
        want = ('one [alias] table of name = "GPU" lines' if key == "alias"
                else f"one [{key}.NAME] table per entry, e.g. [{key}.H100-SXM]")
        raise UserError(f"catalog file {path}: '{key}' is {form}; write {want} (docs/hardware.md)")
    return value


def _merge(base: dict[str, dict[str, Any]], raw: dict[str, Any]) -> None:
    for name, values in raw.items():
        if not isinstance(values, dict):
            raise UserError(f"catalog entry {name!r} must be a table, got {values!r}")
        base[name] = {**base.get(name, {}), **values}


def load_catalog(*paths: Path) -> Catalog:
    """The shipped catalog with each user file in ``paths`` merged over it, in order."""
    gpus: dict[str, dict[str, Any]] = {}
    links: dict[str, dict[str, Any]] = {}
    aliases: dict[str, str] = {}
    for path in (DATA, *paths):
        raw = _read_toml(Path(path))
        _merge(gpus, _section(raw, "gpu", Path(path)))
        _merge(links, _section(raw, "link", Path(path)))
        aliases.update({k.lower(): v for k, v in _section(raw, "alias", Path(path)).items()})
    last = Path(paths[-1]) if paths else DATA
    out_gpus = {n: _build(GpuSpec, n, v, last) for n, v in gpus.items()}
    out_links = {n: _build(LinkSpec, n, v, last) for n, v in links.items()}
    for alias, target in aliases.items():
        if target not in out_gpus:
            raise UserError(f"catalog alias {alias!r} points to unknown GPU {target!r}; valid: "
                            f"{', '.join(sorted(out_gpus))}")
    return Catalog(gpus=out_gpus, links=out_links, aliases=aliases)


_user_paths: tuple[Path, ...] = ()


def use_catalog(*paths: str | Path) -> None:
    """Merge these user files over the shipped catalog from now on (the CLI's --catalog option)."""
    global _user_paths
    _user_paths = tuple(Path(p) for p in paths)
    _cached.cache_clear()


@cache
def _cached(paths: tuple[Path, ...]) -> Catalog:
    return load_catalog(*paths)


def current() -> Catalog:
    env = os.environ.get(ENV_VAR, "")
    env_paths = tuple(Path(p) for p in env.split(os.pathsep) if p)
    return _cached(env_paths + _user_paths)


def gpu_names() -> list[str]:
    return sorted(current().gpus)


def link_names() -> list[str]:
    return sorted(current().links)


def gpu(name: str) -> GpuSpec:
    gpus = current().gpus
    if name not in gpus:
        raise choices_error("GPU", name, list(gpus))
    return gpus[name]


def link(name: str) -> LinkSpec:
    links = current().links
    if name not in links:
        raise choices_error("link", name, list(links))
    return links[name]


def resolve_gpu(name: str) -> str:
    """Catalog name for a catalog name or an alias such as a profile directory ('a100', 'h100')."""
    cat = current()
    if name in cat.gpus:
        return name
    if name.lower() in cat.aliases:
        return cat.aliases[name.lower()]
    lowered = {n.lower(): n for n in cat.gpus}
    if name.lower() in lowered:
        return lowered[name.lower()]
    # the valid list names catalog GPUs only: aliases are lower-case spellings of the same GPUs
    raise choices_error("GPU", name, list(cat.gpus))
