"""Groups of GPUs as placement devices, and the cost of a kernel on one.

Tensor parallelism (layout ``tp``): k GPUs of one type on a fast link act as one device (how vLLM runs 70B
on 2×H100): k× memory and price; GEMMs split k ways (Megatron: q/k/v, gate/up and experts column-parallel,
o_proj/down row-parallel); attention split by heads; the other kernels (norms, residual adds, rotary,
embedding) run replicated at full size on every GPU of the group; each row-parallel GEMM ends with a ring
all-reduce of its output over the group's link: 2·(k−1)/k · bytes / bandwidth + 2·(k−1) · latency. A MoE
block's experts are sharded the same way and its output all-reduced once: charged on the router GEMM,
whose input is exactly the block's tokens × hidden.

Data-parallel attention (layouts ``dp-ep`` and ``dp-tp``, MoE models; how vLLM and SGLang serve DeepSeek-V3
at scale): every GPU of the group runs attention and every other non-expert kernel for its own 1/k of the
sequences (those weights replicated, its sequences' KV on it, no all-reduce after attention); only the
experts are split k ways, by expert (``dp-ep``: E/k experts per GPU, an all-to-all dispatch and combine of
the routed tokens per MoE layer) or by each expert's intermediate dimension (``dp-tp``: the block's tokens
all-gathered before it and its output reduce-scattered after). The group holds k times the sequences one
GPU's KV room holds; a step of the group is one GPU's share of it, the GPUs in lockstep at the MoE layers.

The group's link is NVLink of the GPU's generation where it has one, else PCIe of its generation.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from tessera.cost import CostModel
from tessera.graph import Kernel, KernelGraph, KernelKind, Role
from tessera.hardware import GpuSpec, LinkSpec, best_link

ROUTERS = ("gate", "router")  # MoE routers: the MoE block's output all-reduce is charged here (m·hidden)
ROW_PARALLEL = ("o_proj", "down_proj", "out_proj", "proj_out", "to_out", "dense_4h_to_h", "w2", "wo", "fc2")
ATTENTION_KINDS = (KernelKind.ATTENTION, KernelKind.ATTENTION_DECODE)
# how a group of k GPUs splits a model: tensor parallel throughout; data-parallel attention with the experts
# split by expert (EP) or by intermediate dimension (TP)
LAYOUTS = ("tp", "dp-ep", "dp-tp")
DP_LAYOUTS = ("dp-ep", "dp-tp")
ACT_BYTES = 2  # bytes per element of the hidden states the MoE collectives move (bf16)


@functools.lru_cache(maxsize=256)
def group_link(gpu: GpuSpec, k: int) -> LinkSpec:
    """The link between the GPUs of one group of k × ``gpu``: the best the k GPUs can be built with
    (tessera.hardware.best_link: NVLink where k of them share an NVLink domain, else their PCIe)."""
    return best_link((gpu,) * k)


def unit_name(gpu: str, tp: int, layout: str = "tp") -> str:
    """``H100-SXM``, ``2xH100-SXM`` (tensor parallel), ``8xH200-dp-ep`` (data-parallel attention)."""
    if layout not in LAYOUTS:
        raise ValueError(f"group layout {layout!r}: one of {', '.join(LAYOUTS)}")
    if tp == 1:
        return gpu
    return f"{tp}x{gpu}" if layout == "tp" else f"{tp}x{gpu}-{layout}"


def make_unit(gpu: GpuSpec, tp: int) -> GpuSpec:
    """The device a TP group of ``tp`` × ``gpu`` forms: memory and price × tp (compute via UnitCost)."""
    if tp < 1:
        raise ValueError(f"tensor-parallel degree {tp} must be >= 1")
    if tp == 1:
        return gpu
    return replace(gpu, name=unit_name(gpu.name, tp), mem_bytes=gpu.mem_bytes * tp,
                   usd_per_hour=gpu.usd_per_hour * tp, power_w=gpu.power_w * tp)


def is_moe_kernel(k: Kernel) -> bool:
    """A fused MoE kernel (capture.fuse): dims tokens, hidden, inter, topk, experts, expert_bytes."""
    return "expert_bytes" in k.dims


def has_moe(g: KernelGraph) -> bool:
    return any(is_moe_kernel(k) for k in g.kernels)


def expert_weights(g: KernelGraph) -> list[tuple[int, int]]:
    """(weight bytes, experts) of each MoE block: the weight buffers its fused kernel reads."""
    out = []
    for k in g.kernels:
        if is_moe_kernel(k):
            w = sum(g.buffers[b].bytes for b in set(k.reads) if g.buffers[b].role == Role.WEIGHT)
            out.append((w, k.dims["experts"]))
    return out


def gpu_weight_bytes(g: KernelGraph, k: int, layout: str) -> int:
    """Weight bytes on one GPU of a group of ``k`` holding graph ``g``: ``tp`` 1/k of every weight (as
    make_unit counts it: the whole model in k× memory); ``dp-ep`` the non-expert weights whole (replicated)
    and ⌈E/k⌉ of each MoE block's E experts; ``dp-tp`` the non-expert weights whole and 1/k of every
    expert."""
    total = sum(b.bytes for b in g.buffers if b.role == Role.WEIGHT)
    if layout == "tp":
        return math.ceil(total / k)
    blocks = expert_weights(g)
    replicated = total - sum(w for w, _ in blocks)
    if layout == "dp-ep":
        return replicated + sum(w * math.ceil(e / k) // e for w, e in blocks)
    if layout == "dp-tp":
        return replicated + sum(math.ceil(w / k) for w, _ in blocks)
    raise ValueError(f"group layout {layout!r}: one of {', '.join(LAYOUTS)}")


def make_dp_unit(gpu: GpuSpec, k: int, layout: str, g: KernelGraph) -> GpuSpec | None:
    """The device a data-parallel-attention group of ``k`` × ``gpu`` forms for model graph ``g`` (k× price),
    or None when one GPU's share of the weights does not fit one GPU.

    The verifier counts each weight, the group's KV and its activations once; one GPU holds
    w = gpu_weight_bytes(g, k, layout), its 1/k of the KV and of the activations. Every GPU fits when
    k·w + KV + activations ≤ k·M (M one GPU's memory), i.e. when the verifier's count W + KV + activations
    fits k·M − (k·w − W): that is the unit's ``mem_bytes``; the KV room it leaves is k × one GPU's."""
    if layout not in DP_LAYOUTS or k < 2:
        raise ValueError(f"data-parallel group layout {layout!r} of {k} GPUs: one of {', '.join(DP_LAYOUTS)}, "
                         f"k >= 2")
    w = gpu_weight_bytes(g, k, layout)
    if w >= gpu.mem_bytes:
        return None
    total = sum(b.bytes for b in g.buffers if b.role == Role.WEIGHT)
    return replace(gpu, name=unit_name(gpu.name, k, layout), mem_bytes=k * gpu.mem_bytes - (k * w - total),
                   usd_per_hour=gpu.usd_per_hour * k, power_w=gpu.power_w * k)


def is_row_parallel(k: Kernel) -> bool:
    last = k.module.rsplit(".", 1)[-1]
    return any(last == r or last.endswith(r) for r in ROW_PARALLEL)


def in_shared_expert(k: Kernel) -> bool:
    """A MoE block's shared expert (DeepSeek's ``shared_experts``, Qwen-MoE's ``shared_expert``): its output
    joins the routed experts' before the block's one all-reduce, as vLLM reduces them together."""
    return "shared_expert" in k.module


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
    if is_moe_kernel(k):
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


def touched_expert_bytes(experts: int, topk: int, tokens: float, expert_bytes: int) -> float:
    """Expert weight bytes ``tokens`` tokens read when each picks ``topk`` of ``experts`` uniformly: the
    experts touched in expectation, E·(1 − (1 − k/E)^T) (the expectation capture prices a MoE kernel with)."""
    return experts * (1.0 - (1.0 - topk / experts) ** tokens) * expert_bytes


def dp_share(k: Kernel, n: int) -> Kernel:
    """One GPU's share of non-expert kernel ``k`` under data-parallel attention over ``n`` GPUs: its own
    1/n of the tokens (sequences for attention), the weights whole. A GEMM keeps its weight bytes and
    scales its rows; attention keeps its heads and takes ⌈batch/n⌉ sequences (a chunk of fewer prompts
    than GPUs: ⌈q_len/n⌉ of its query tokens); any other kernel does 1/n of its work."""
    d = dict(k.dims)
    if k.kind is KernelKind.GEMM and {"m", "n", "k"} <= d.keys():
        rows = max(1, math.ceil(d["m"] / n))
        w, act_in = d["k"] * d["n"], d["m"] * d["k"]  # elements of the weight and of the input
        frac = rows / d["m"]
        read = k.bytes_read * (w + act_in * frac) / max(1, w + act_in)
        return replace(k, dims={**d, "m": rows}, flops=int(k.flops * frac), bytes_read=int(read),
                       bytes_written=int(k.bytes_written * frac))
    if k.kind in ATTENTION_KINDS and d.get("batch", 1) >= n:
        d["batch"] = math.ceil(d["batch"] / n)
        frac = d["batch"] / k.dims["batch"]
    elif k.kind in ATTENTION_KINDS and d.get("q_len", 1) > 1:
        q = max(1, math.ceil(d["q_len"] / n))
        d["kv_len"], d["q_len"] = d.get("kv_len", d["q_len"]) - d["q_len"] + q, q
        frac = q / k.dims["q_len"]
    else:
        frac = 1 / n
        if "numel" in d:
            d["numel"] = max(1, math.ceil(d["numel"] / n))
    return replace(k, dims=d, flops=int(k.flops * frac), bytes_read=int(k.bytes_read * frac),
                   bytes_written=int(k.bytes_written * frac))


def ep_share(k: Kernel, n: int) -> Kernel:
    """One GPU's share of fused MoE kernel ``k`` under expert parallelism over ``n`` GPUs: E' = ⌈E/n⌉ of
    the E experts, receiving the T·topk/n token-expert pairs routed to them (uniform routing), written as
    the table's MoE shape T' tokens each picking topk' = min(topk, E') of E' experts with T'·topk' =
    ⌈T·topk/n⌉ (the same pairs and, to first order, the same experts touched: (1 − topk/E)^T ≈
    (1 − topk'/E')^T'). FLOPs and activations / n; weight bytes those of the local experts touched."""
    d = k.dims
    e_loc = math.ceil(d["experts"] / n)
    top = min(d["topk"], e_loc)
    tokens = max(1, math.ceil(d["tokens"] * d["topk"] / (n * top)))
    act = max(0.0, k.bytes_read - touched_expert_bytes(d["experts"], d["topk"], d["tokens"], d["expert_bytes"]))
    read = touched_expert_bytes(e_loc, top, tokens, d["expert_bytes"]) + act / n
    return replace(k, dims={**d, "tokens": tokens, "topk": top, "experts": e_loc}, flops=k.flops // n,
                   bytes_read=int(read), bytes_written=k.bytes_written // n)


def dispatch_bytes(k: Kernel, n: int) -> float:
    """Bytes one GPU sends to the others in one all-to-all dispatch of fused MoE kernel ``k`` under EP over
    ``n`` GPUs (the combine returns as many): its ⌈T/n⌉ tokens' hidden states, one copy per other GPU that
    holds at least one of a token's topk experts (DeepEP and vLLM's all-to-all kernels send a token once
    per destination rank). With E' = ⌈E/n⌉ experts per GPU and topk distinct picks of E, another GPU is
    hit with probability p = 1 − C(E − E', topk) / C(E, topk):
        bytes = ⌈T/n⌉ · (n − 1) · p · hidden · ACT_BYTES."""
    d = k.dims
    e, top = d["experts"], d["topk"]
    miss = math.comb(e - math.ceil(e / n), top) / math.comb(e, top)
    return math.ceil(d["tokens"] / n) * (n - 1) * (1.0 - miss) * d["hidden"] * ACT_BYTES


def allreduce_s(nbytes: int, tp: int, lk: LinkSpec) -> float:
    """Ring all-reduce of ``nbytes`` over ``tp`` GPUs."""
    if tp == 1:
        return 0.0
    return 2 * (tp - 1) / tp * nbytes / (lk.bytes_per_s * lk.efficiency) + 2 * (tp - 1) * lk.latency_s


def alltoall_s(sent_bytes: float, n: int, lk: LinkSpec) -> float:
    """All-to-all in which each of ``n`` GPUs sends ``sent_bytes`` to the others: NCCL's alltoall moves
    (n−1)/n of each rank's buffer S at the bus bandwidth, t = S·(n−1)/n / busbw (nccl-tests
    doc/PERFORMANCE.md, busbw = algbw·(n−1)/n), i.e. the bytes that leave the GPU over its link; plus
    one message latency per peer, n − 1 (a pairwise exchange, as the ring counts one per step)."""
    if n == 1:
        return 0.0
    return sent_bytes / (lk.bytes_per_s * lk.efficiency) + (n - 1) * lk.latency_s


def moe_comm_s(k: Kernel, n: int, layout: str, lk: LinkSpec) -> float:
    """The collectives of one fused MoE kernel under data-parallel attention over ``n`` GPUs.
    ``dp-ep``: all-to-all dispatch and combine, 2 · alltoall_s(dispatch_bytes).
    ``dp-tp``: all-gather of the block's T tokens before it and reduce-scatter of its output after, each
    (n−1)/n · T·hidden·ACT_BYTES at the bus bandwidth (nccl-tests doc/PERFORMANCE.md: allgather and
    reduce_scatter busbw = algbw·(n−1)/n) with n − 1 ring steps: together exactly a ring all-reduce of
    T·hidden·ACT_BYTES (which is how NCCL's ring all-reduce is built)."""
    if layout == "dp-ep":
        return 2 * alltoall_s(dispatch_bytes(k, n), n, lk)
    return allreduce_s(k.dims["tokens"] * k.dims["hidden"] * ACT_BYTES, n, lk)


@dataclass(frozen=True, kw_only=True)
class UnitCost:
    """The cost model seen through GPU groups: kernel_time_s(kernel, unit) for units made by make_unit or
    make_dp_unit; any other GPU is priced by ``cost`` directly. Same interface as CostModel."""

    cost: CostModel
    # unit name -> (gpu, k, layout)
    units: dict[str, tuple[GpuSpec, int, str]] = field(default_factory=dict, hash=False)
    # (kernel signature, device) -> seconds: the layers of a model repeat the same kernels, and a search
    # prices the same shapes many times
    memo: dict[tuple, float] = field(default_factory=dict, hash=False, compare=False)

    @classmethod
    def over(cls, cost: CostModel, units: tuple[tuple, ...] = ()) -> UnitCost:
        """``units``: (gpu, k) tensor-parallel groups, or (gpu, k, layout) groups of any layout."""
        new = {unit_name(u[0].name, u[1], *u[2:]): (u[0], u[1], u[2] if len(u) > 2 else "tp")
               for u in units if u[1] > 1}
        if isinstance(cost, UnitCost):
            # keys name the device (unit names differ by k and layout): the memo is safe to share
            return cls(cost=cost.cost, units={**cost.units, **new}, memo=cost.memo)
        return cls(cost=cost, units=new)

    def kernel_time_s(self, kernel: Kernel, gpu: GpuSpec) -> float:
        tp = self.units[gpu.name][1] if gpu.name in self.units else 1
        role = (is_row_parallel(kernel), kernel.module.rsplit(".", 1)[-1] in ROUTERS,
                in_shared_expert(kernel)) if tp > 1 else ()
        key = (gpu.name, kernel.cost_signature, role)
        t = self.memo.get(key)
        if t is None:
            t = self.memo[key] = self._time(kernel, gpu)
        return t

    def _time(self, kernel: Kernel, gpu: GpuSpec) -> float:
        if gpu.name not in self.units:
            return self.cost.kernel_time_s(kernel, gpu)
        base, k, layout = self.units[gpu.name]
        if layout in DP_LAYOUTS:
            return self._dp_time(kernel, base, k, layout)
        t = self.cost.kernel_time_s(shard(kernel, k), base)
        if kernel.kind is KernelKind.GEMM and is_row_parallel(kernel) and not in_shared_expert(kernel):
            t += allreduce_s(kernel.bytes_written, k, group_link(base, k))
        elif kernel.kind is KernelKind.GEMM and kernel.module.rsplit(".", 1)[-1] in ROUTERS:
            d = kernel.dims
            t += allreduce_s(d.get("m", 1) * d.get("k", 1) * 2, k, group_link(base, k))
        return t

    def _dp_time(self, kernel: Kernel, base: GpuSpec, k: int, layout: str) -> float:
        """One GPU's share of ``kernel`` in a data-parallel-attention group (module doc), with the MoE
        block's collectives charged on its fused kernel."""
        if not is_moe_kernel(kernel):
            return self.cost.kernel_time_s(dp_share(kernel, k), base)
        share = ep_share(kernel, k) if layout == "dp-ep" else _shard_moe(kernel, k)
        return self.cost.kernel_time_s(share, base) + moe_comm_s(kernel, k, layout, group_link(base, k))

    def transfer_time_s(self, nbytes: int, lk: LinkSpec) -> float:
        return self.cost.transfer_time_s(nbytes, lk)

    def tp_of(self, gpu: GpuSpec) -> int:
        return self.units[gpu.name][1] if gpu.name in self.units else 1

    def layout_of(self, gpu: GpuSpec) -> str:
        return self.units[gpu.name][2] if gpu.name in self.units else "tp"
