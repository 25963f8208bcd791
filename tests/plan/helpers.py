"""Hand-sized graphs and a table cost model for worked MILP examples."""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.cost import CostModel
from tessera.graph import Buffer, Kernel, KernelGraph, KernelKind, Role, build_graph
from tessera.hardware import LinkSpec
from tessera.plan.pool import Pool, resolve_gpu


@dataclass(frozen=True, kw_only=True)
class TableCost(CostModel):
    """kernel time from a table by (kernel name, GPU name); transfers at 1 GB/s, no latency."""

    table: dict[tuple[str, str], float] = field(default_factory=dict, hash=False)

    def kernel_time_s(self, kernel, gpu) -> float:  # type: ignore[override]
        return self.table[kernel.name, gpu.name]

    def transfer_time_s(self, nbytes: int, link) -> float:  # type: ignore[override]
        return nbytes / 1e9


H, L = "H100-SXM", "L40S"
POOL = Pool(gpus=(resolve_gpu(H), resolve_gpu(L)), link=LinkSpec(name="test", bytes_per_s=1e9, latency_s=0.0))
# chain a -> b -> c; seconds on (H100, L40S)
TIMES = {"a": (2.0, 4.0), "b": (3.0, 3.0), "c": (4.0, 2.0)}
COST = TableCost(table={(k, g): t[i] for k, t in TIMES.items() for i, g in enumerate((H, L))})


def chain3(weight_bytes: int = 1_000, shared: bool = False) -> KernelGraph:
    """x -> a -> b -> c -> out, each value 0.5 GB (0.5 s on the 1 GB/s link); one weight per kernel
    (``shared``: a and c use the same weight)."""
    bufs = [Buffer(id=0, name="x", bytes=8, role=Role.INPUT)]
    for i, n in enumerate(("va", "vb", "vc")):
        bufs.append(Buffer(id=1 + i, name=n, bytes=500_000_000, role=Role.ACTIVATION))
    for i, n in enumerate(("wa", "wb", "wc")):
        bufs.append(Buffer(id=4 + i, name=n, bytes=weight_bytes, role=Role.WEIGHT))
    wc = 4 if shared else 6
    ks = [Kernel(id=0, name="a", kind=KernelKind.GEMM, flops=1, bytes_read=1, bytes_written=1, reads=(0, 4),
                 writes=(1,), layer=None),
          Kernel(id=1, name="b", kind=KernelKind.GEMM, flops=1, bytes_read=1, bytes_written=1, reads=(1, 5),
                 writes=(2,), layer=None),
          Kernel(id=2, name="c", kind=KernelKind.GEMM, flops=1, bytes_read=1, bytes_written=1, reads=(2, wc),
                 writes=(3,), layer=None)]
    return build_graph(model="chain3", phase="decode", shape={"batch": 1}, kernels=ks, buffers=bufs)
