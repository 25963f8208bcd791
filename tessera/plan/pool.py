"""The pool (devices + the link between them), the workload, and GPU-name aliases."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tessera.errors import UserError, choices_error
from tessera.hardware import AUTO, GpuSpec, LinkSpec, cell_link, gpu, gpu_names, link, link_names

# Short names people type, mapped to the catalog entry the paper's pairs mean (SXM parts, 80 GB A100).
ALIASES = {"h100": "H100-SXM", "a100": "A100-80GB-SXM", "a100-80gb": "A100-80GB-SXM"}


def resolve_gpu(name: str) -> GpuSpec:
    """Catalog name, case-insensitive, an alias (H100, A100), or a unique prefix of one name."""
    names = gpu_names()
    if name.strip().lower() in ALIASES and ALIASES[name.strip().lower()] in names:
        return gpu(ALIASES[name.strip().lower()])
    exact = [n for n in names if n.lower() == name.strip().lower()]
    if exact:
        return gpu(exact[0])
    pref = [n for n in names if n.lower().startswith(name.strip().lower())]
    if len(pref) == 1:
        return gpu(pref[0])
    aliases = [f"{a.upper()} (= {t})" for a, t in ALIASES.items() if t in names and a != t.lower()]
    raise choices_error("GPU", name, [*names, *aliases])  # what a user may type: names and aliases


# per GPU, what an engine's runtime holds beside weights, KV and activations: the CUDA context, cuBLAS and NCCL
# workspaces, the decode CUDA graphs' pool (vLLM counts them as non-torch memory and its graph pool; about
# 1.5-3.5 GiB on an 80 GiB GPU, the upper end being NVIDIA AIConfigurator's vLLM memory model)
RUNTIME_RESERVE_BYTES = 2 << 30


def engine_gpu(spec: GpuSpec, utilization: float) -> GpuSpec:
    """The GPU as an engine may fill it: ``utilization`` of its memory (vLLM's gpu_memory_utilization,
    0.9 by default: what it leaves is for other processes and fragmentation), less what the engine's
    runtime holds outside its weights, KV and activations (RUNTIME_RESERVE_BYTES; vLLM's memory profile
    counts the same non-torch memory and CUDA graphs). Weights, KV and activations must fit this."""
    return replace(spec, mem_bytes=int(spec.mem_bytes * utilization) - RUNTIME_RESERVE_BYTES)


def resolve_link(name: str) -> LinkSpec:
    names = link_names()
    exact = [n for n in names if n.lower() == name.strip().lower()]
    if exact:
        return link(exact[0])
    raise choices_error("link", name, names)


@dataclass(frozen=True, kw_only=True)
class Pool:
    """One cell's devices (index = position) and the link between every pair (full duplex)."""

    gpus: tuple[GpuSpec, ...]
    link: LinkSpec

    def __post_init__(self) -> None:
        if not self.gpus:
            raise UserError("the pool has no GPUs; give --gpus A,B")

    @classmethod
    def parse(cls, gpus: list[str] | str, link_name: str = AUTO) -> Pool:
        """``link_name``: a catalog link the cell can have, or auto (its best)."""
        names = gpus.split(",") if isinstance(gpus, str) else gpus
        specs = tuple(resolve_gpu(n) for n in names if n.strip())
        if not specs:
            raise UserError("the pool has no GPUs; give --gpus A,B")
        return cls(gpus=specs, link=cell_link(specs, link_name))

    @property
    def n(self) -> int:
        return len(self.gpus)

    @property
    def names(self) -> list[str]:
        return [g.name for g in self.gpus]

    @property
    def usd_per_hour(self) -> float:
        return sum(g.usd_per_hour for g in self.gpus)

    def pairs(self) -> list[tuple[int, int]]:
        """Directed device pairs (d1, d2), d1 != d2: one link direction each."""
        return [(a, b) for a in range(self.n) for b in range(self.n) if a != b]
