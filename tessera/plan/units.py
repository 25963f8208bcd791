"""Tensor-parallel groups as placement devices, and the cost of a kernel on one.

k GPUs of one type on a fast link act as one device (how vLLM runs 70B on 2×H100): k× memory and price;
GEMMs split k ways (Megatron: q/k/v, gate/up and experts column-parallel, o_proj/down row-parallel);
attention split by heads; the other kernels (norms, residual adds, rotary, embedding) run replicated at
full size on every GPU of the group; each row-parallel GEMM ends with a ring all-reduce of its output
over the group's link: 2·(k−1)/k · bytes / bandwidth + 2·(k−1) · latency. A MoE block's experts are
sharded the same way and its output all-reduced once: charged on the router GEMM, whose input is
exactly the block's tokens × hidden.
The group's link is NVLink of the GPU's generation where it has one, else PCIe of its generation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tessera.cost import CostModel
from tessera.graph import Kernel, KernelKind
from tessera.hardware import GpuSpec, LinkSpec, link, link_names

ROUTERS = ("gate", "router")  # MoE routers: the MoE block's output all-reduce is charged here (m·hidden)
ROW_PARALLEL = ("o_proj", "down_proj", "out_proj", "proj_out", "to_out", "dense_4h_to_h", "w2", "wo", "fc2")
ATTENTION_KINDS = (KernelKind.ATTENTION, KernelKind.ATTENTION_DECODE)


def group_link(gpu: GpuSpec) -> LinkSpec:
    """The link between the GPUs of one tensor-parallel group of ``gpu``."""
    names = link_names()
    if gpu.nvlink_gen and f"nvlink{gpu.nvlink_gen}" in names:
        return link(f"nvlink{gpu.nvlink_gen}")
    gen = gpu.pcie_gen if f"pcie{gpu.pcie_gen}" in names else 4
    return link(f"pcie{gen}")


def unit_name(gpu: str, tp: int) -> str:
    return gpu if tp == 1 else f"{tp}x{gpu}"


def make_unit(gpu: GpuSpec, tp: int) -> GpuSpec:
    """The device a TP group of ``tp`` × ``gpu`` forms: memory and price × tp (compute via UnitCost)."""
    if tp < 1:
        raise ValueError(f"tensor-parallel degree {tp} must be >= 1")
    if tp == 1:
        return gpu
    return replace(gpu, name=unit_name(gpu.name, tp), mem_bytes=gpu.mem_bytes * tp,
                   usd_per_hour=gpu.usd_per_hour * tp, power_w=gpu.power_w * tp)


def is_row_parallel(k: Kernel) -> bool:
    last = k.module.rsplit(".", 1)[-1]
    return any(last == r or last.endswith(r) for r in ROW_PARALLEL)


def shard(k: Kernel, tp: int) -> Kernel:
    """One GPU's share of kernel ``k`` in a TP group of ``tp``."""
    d = dict(k.dims)
    if k.kind is KernelKind.GEMM and {"m", "n", "k"} <= d.keys():
        axis = "k" if is_row_parallel(k) else "n"
        d[axis] = max(1, math.ceil(d[axis] / tp))
        act_in = d["m"] * k.dims["k"]  # elements of the input, weight = k·n elements
        frac_w = (k.dims["k"] * k.dims["n"]) / max(1, act_in + k.dims["k"] * k.dims["n"])
        read = k.bytes_read * (frac_w / tp + (1 - frac_w) * (1 / tp if axis == "k" else 1))
        written = k.bytes_written / (tp if axis == "n" else 1)
        return replace(k, dims=d, flops=k.flops // tp, bytes_read=int(read), bytes_written=int(written))
    if "expert_bytes" in d:
        return _shard_moe(k, tp)
    if k.kind in ATTENTION_KINDS:
        d["heads"] = max(1, math.ceil(d.get("heads", tp) / tp))
        d["kv_heads"] = max(1, math.ceil(d.get("kv_heads", tp) / tp))
        return replace(k, dims=d, flops=k.flops // tp, bytes_read=k.bytes_read // tp,
                       bytes_written=k.bytes_written // tp)
    return k


def _shard_moe(k: Kernel, tp: int) -> Kernel:
    """One GPU's share of a fused MoE kernel: every expert's intermediate dimension split k ways (as vLLM
    shards fused_moe under TP), so FLOPs and expert weight bytes / tp; tokens in and out stay whole."""
    d = {**k.dims, "inter": max(1, math.ceil(k.dims["inter"] / tp)), "expert_bytes": k.dims["expert_bytes"] // tp}
    return replace(k, dims=d, flops=k.flops // tp, bytes_read=k.bytes_read // tp)


def allreduce_s(nbytes: int, tp: int, lk: LinkSpec) -> float:
    """Ring all-reduce of ``nbytes`` over ``tp`` GPUs."""
    if tp == 1:
        return 0.0
    return 2 * (tp - 1) / tp * nbytes / (lk.bytes_per_s * lk.efficiency) + 2 * (tp - 1) * lk.latency_s


@dataclass(frozen=True, kw_only=True)
class UnitCost:
    """The cost model seen through TP groups: kernel_time_s(kernel, unit) for units made by make_unit;
    any other GPU is priced by ``cost`` directly. Same interface as CostModel."""

    cost: CostModel
    units: dict[str, tuple[GpuSpec, int]] = field(default_factory=dict, hash=False)  # unit name -> (gpu, tp)
    # (kernel signature, device) -> seconds: the layers of a model repeat the same kernels, and a search
    # prices the same shapes many times
    memo: dict[tuple, float] = field(default_factory=dict, hash=False, compare=False)

    @classmethod
    def over(cls, cost: CostModel, units: tuple[tuple[GpuSpec, int], ...] = ()) -> UnitCost:
        if isinstance(cost, UnitCost):
            return cls(cost=cost.cost, units={**cost.units, **{unit_name(g.name, tp): (g, tp)
                                                               for g, tp in units if tp > 1}},
                       memo=cost.memo)  # keys name the device (unit names differ by tp): safe to share
        return cls(cost=cost, units={unit_name(g.name, tp): (g, tp) for g, tp in units if tp > 1})

    def kernel_time_s(self, kernel: Kernel, gpu: GpuSpec) -> float:
        tp = self.units[gpu.name][1] if gpu.name in self.units else 1
        role = (is_row_parallel(kernel), kernel.module.rsplit(".", 1)[-1] in ROUTERS) if tp > 1 else ()
        key = (gpu.name, kernel.name, kernel.kind, kernel.dtype, kernel.flops, kernel.bytes_read,
               kernel.bytes_written, tuple(sorted(kernel.dims.items())), role)
        t = self.memo.get(key)
        if t is None:
            t = self.memo[key] = self._time(kernel, gpu)
        return t

    def _time(self, kernel: Kernel, gpu: GpuSpec) -> float:
        if gpu.name not in self.units:
            return self.cost.kernel_time_s(kernel, gpu)
        base, tp = self.units[gpu.name]
        t = self.cost.kernel_time_s(shard(kernel, tp), base)
        if kernel.kind is KernelKind.GEMM and is_row_parallel(kernel):
            t += allreduce_s(kernel.bytes_written, tp, group_link(base))
        elif kernel.kind is KernelKind.GEMM and kernel.module.rsplit(".", 1)[-1] in ROUTERS:
            d = kernel.dims
            t += allreduce_s(d.get("m", 1) * d.get("k", 1) * 2, tp, group_link(base))
        return t

    def transfer_time_s(self, nbytes: int, lk: LinkSpec) -> float:
        return self.cost.transfer_time_s(nbytes, lk)

    def tp_of(self, gpu: GpuSpec) -> int:
        return self.units.get(gpu.name, (gpu, 1))[1]
