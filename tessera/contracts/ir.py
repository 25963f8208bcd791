"""The kernel-graph IR every stage speaks: kernels, buffers and the dependencies between them."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any

IR_VERSION = 1


class Role(StrEnum):
    """What a buffer holds; decides whether it travels (activations) or stays resident."""

    WEIGHT = "weight"
    ACTIVATION = "activation"
    KV = "kv"
    STATE = "state"  # SSM recurrent / conv state, persists across steps like KV
    INPUT = "input"  # token ids, positions, masks, latents handed to the step
    OUTPUT = "output"  # logits, denoised latents


RESIDENT_ROLES = frozenset({Role.WEIGHT, Role.KV, Role.STATE})


class KernelKind(StrEnum):
    """Kernel classes the cost model distinguishes (one roofline efficiency each)."""

    GEMM = "gemm"
    ATTENTION = "attention"  # prefill / full attention: q_len > 1
    ATTENTION_DECODE = "attention_decode"  # q_len == 1 against a KV cache
    ELEMENTWISE = "elementwise"
    NORM = "norm"  # norms, softmax and other reductions
    EMBEDDING = "embedding"  # gather / index_select / scatter
    MOE_ROUTING = "moe_routing"  # tokens gathered to their expert and scattered back (weighted) after it
    SCAN = "scan"  # SSM selective scan / chunked state passing
    CONV = "conv"
    COPY = "copy"  # materialising copies, cat, index_copy_ into caches
    OTHER = "other"


DEPS_FROM = ("schema", "ptx")  # the sources of a kernel's reads/writes


class EdgeKind(StrEnum):
    RAW = "raw"  # true dependency: data flows
    WAR = "war"  # ordering only
    WAW = "waw"  # ordering only


@dataclass(frozen=True, kw_only=True)
class Buffer:
    """One allocation (a storage); views of one storage are one buffer."""

    id: int
    name: str
    bytes: int
    role: Role
    dtype: str = "bfloat16"
    shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.bytes < 0:
            raise ValueError(f"buffer {self.name!r}: bytes={self.bytes} must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Kernel:
    """One launched operator, in program order (``id`` is its position)."""

    id: int
    name: str  # operator or CUDA entry name, e.g. "aten.mm.default"
    kind: KernelKind
    flops: int
    bytes_read: int
    bytes_written: int
    reads: tuple[int, ...]  # buffer ids
    writes: tuple[int, ...]  # buffer ids; a read-write buffer is in both
    layer: int | None = None  # None: prologue / epilogue
    module: str = ""  # module path, e.g. "model.layers.3.self_attn.q_proj"
    phase: str = ""
    dtype: str = "bfloat16"
    # Shape facts the cost model uses; keys by kind: gemm m,n,k,batch; attention
    # batch,heads,kv_heads,q_len,kv_len,head_dim (+ latent for absorbed MLA: the cache is one latent
    # of head_dim = latent + rope values per token, not separate keys and values); others numel.
    dims: dict[str, int] = field(default_factory=dict, hash=False)
    indirect: bool = False  # access pattern unknown: reads/writes widened to whole buffers
    # where reads/writes come from: "schema" (the operator's declared schema) or "ptx" (the analysis of
    # the kernel's compiled PTX, e.g. a captured Triton launch)
    deps_from: str = "schema"

    def __post_init__(self) -> None:
        if self.flops < 0 or self.bytes_read < 0 or self.bytes_written < 0:
            raise ValueError(f"kernel {self.id} {self.name}: negative flops/bytes")
        if self.deps_from not in DEPS_FROM:
            raise ValueError(f"kernel {self.id} {self.name}: deps_from={self.deps_from!r} not in {DEPS_FROM}")

    # derived once per kernel and kept in the instance's __dict__ beside its fields (frozen allows writing
    # there): the planner asks for both in every evaluation of every placement it scores. Not
    # functools.cached_property, whose per-call lock costs more than the tuples it saves.

    @property
    def touches(self) -> tuple[int, ...]:
        """Every buffer it reads or writes, once each, ascending."""
        got = self.__dict__.get("_touches")
        if got is None:
            got = self.__dict__["_touches"] = tuple(sorted(set(self.reads) | set(self.writes)))
        return got

    @property
    def cost_signature(self) -> tuple:
        """What its time on a GPU depends on: the operator, kind, dtype, work and shape facts (not its id,
        buffers or place in the model: the layers of a model repeat one signature)."""
        got = self.__dict__.get("_cost_signature")
        if got is None:
            got = self.__dict__["_cost_signature"] = (
                self.name, self.kind, self.dtype, self.flops, self.bytes_read, self.bytes_written,
                tuple(sorted(self.dims.items())))
        return got


@dataclass(frozen=True)
class Edge:
    src: int  # kernel id
    dst: int  # kernel id, src < dst
    kind: EdgeKind
    buffer: int


@dataclass(frozen=True, kw_only=True)
class KernelGraph:
    """Kernels of one model step and the buffers they touch."""

    model: str
    phase: str  # prefill | decode | denoise | encode | ptx
    shape: dict[str, int] = field(default_factory=dict, hash=False)  # batch, seq, context, ...
    kernels: tuple[Kernel, ...]
    buffers: tuple[Buffer, ...]
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        for i, k in enumerate(self.kernels):
            assert k.id == i, f"kernel ids must be program positions: kernel {k.id} at {i}"
        for i, b in enumerate(self.buffers):
            assert b.id == i, f"buffer ids must be positions: buffer {b.id} at {i}"
        n = len(self.buffers)
        for k in self.kernels:
            for b in (*k.reads, *k.writes):
                assert 0 <= b < n, f"kernel {k.id} touches unknown buffer {b}"

    # ---- dependencies -------------------------------------------------------------------

    @cached_property
    def edges(self) -> tuple[Edge, ...]:
        """RAW/WAR/WAW edges in program order, one per (src, dst, kind, buffer)."""
        last_writer: dict[int, int] = {}
        readers: dict[int, list[int]] = defaultdict(list)  # readers since the last write
        out: list[Edge] = []
        for k in self.kernels:
            for b in dict.fromkeys(k.reads):
                w = last_writer.get(b)
                if w is not None and w != k.id:
                    out.append(Edge(w, k.id, EdgeKind.RAW, b))
            for b in dict.fromkeys(k.writes):
                w = last_writer.get(b)
                if w is not None and w != k.id:
                    out.append(Edge(w, k.id, EdgeKind.WAW, b))
                for r in dict.fromkeys(readers[b]):
                    if r != k.id:
                        out.append(Edge(r, k.id, EdgeKind.WAR, b))
            for b in k.writes:
                last_writer[b] = k.id
                readers[b] = []
            for b in k.reads:
                if b not in k.writes:
                    readers[b].append(k.id)
        return tuple(out)

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        succ: list[set[int]] = [set() for _ in self.kernels]
        for e in self.edges:
            succ[e.src].add(e.dst)
        return tuple(tuple(sorted(s)) for s in succ)

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        pred: list[set[int]] = [set() for _ in self.kernels]
        for e in self.edges:
            pred[e.dst].add(e.src)
        return tuple(tuple(sorted(s)) for s in pred)

    def topological_order(self) -> list[int]:
        """Kahn's algorithm; raises AssertionError on a cycle (edges only go forward, so never)."""
        indeg = [len(p) for p in self.predecessors]
        ready = [k for k, d in enumerate(indeg) if d == 0]
        order: list[int] = []
        while ready:
            k = ready.pop()
            order.append(k)
            for s in self.successors[k]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        assert len(order) == len(self.kernels), "kernel graph has a cycle"
        return order

    def producers(self) -> dict[int, int]:
        """buffer id -> first kernel that writes it."""
        first: dict[int, int] = {}
        for k in self.kernels:
            for b in k.writes:
                first.setdefault(b, k.id)
        return first

    def check_invariants(self) -> None:
        """Every read has an earlier writer or is a step input / resident buffer; graph acyclic."""
        written: set[int] = set()
        free_roles = {Role.INPUT, *RESIDENT_ROLES}
        for k in self.kernels:
            for b in k.reads:
                buf = self.buffers[b]
                if b not in written and buf.role not in free_roles:
                    raise AssertionError(
                        f"kernel {k.id} {k.name} reads {buf.role} buffer {buf.name} before any write"
                    )
            written.update(k.writes)
        self.topological_order()

    # ---- grouping and totals -------------------------------------------------------------

    def by_layer(self) -> dict[int | None, list[Kernel]]:
        groups: dict[int | None, list[Kernel]] = defaultdict(list)
        for k in self.kernels:
            groups[k.layer].append(k)
        return dict(groups)

    @property
    def layers(self) -> int:
        return len({k.layer for k in self.kernels if k.layer is not None})

    @property
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels)

    @property
    def bytes_read(self) -> int:
        return sum(k.bytes_read for k in self.kernels)

    @property
    def bytes_written(self) -> int:
        return sum(k.bytes_written for k in self.kernels)

    def bytes_by_role(self) -> dict[Role, int]:
        """Total bytes of the buffers of each role that some kernel touches."""
        touched = {b for k in self.kernels for b in (*k.reads, *k.writes)}
        out = {r: 0 for r in Role}
        for b in self.buffers:
            if b.id in touched:
                out[b.role] += b.bytes
        return out

    def kinds(self) -> dict[KernelKind, int]:
        out: dict[KernelKind, int] = defaultdict(int)
        for k in self.kernels:
            out[k.kind] += 1
        return dict(out)

    def iter_touching(self, buffer_id: int) -> Iterator[Kernel]:
        for k in self.kernels:
            if buffer_id in k.reads or buffer_id in k.writes:
                yield k

    # ---- serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "ir_version": IR_VERSION,
            "model": self.model,
            "phase": self.phase,
            "shape": dict(self.shape),
            "meta": self.meta,
            "buffers": [asdict(b) for b in self.buffers],
            "kernels": [asdict(k) for k in self.kernels],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelGraph:
        if not isinstance(d, dict):
            raise ValueError(f"kernel graph must be a JSON object, got {type(d).__name__}")
        if d.get("ir_version") != IR_VERSION:
            raise ValueError(f"kernel graph ir_version {d.get('ir_version')!r} is not {IR_VERSION}")
        bufs = tuple(
            Buffer(**{**b, "role": Role(b["role"]), "shape": tuple(b["shape"])}) for b in d["buffers"]
        )
        kers = tuple(
            Kernel(
                **{
                    **k,
                    "kind": KernelKind(k["kind"]),
                    "reads": tuple(k["reads"]),
                    "writes": tuple(k["writes"]),
                }
            )
            for k in d["kernels"]
        )
        return cls(
            model=d["model"], phase=d["phase"], shape=dict(d["shape"]), kernels=kers, buffers=bufs,
            meta=dict(d.get("meta", {})),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, s: str) -> KernelGraph:
        return cls.from_dict(json.loads(s))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> KernelGraph:
        try:
            text = Path(path).read_text()
            return cls.from_json(text)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, AssertionError) as e:
            raise ValueError(f"cannot read kernel graph {path}: {e}") from None


def build_graph(
    *, model: str, phase: str, shape: dict[str, int], kernels: Iterable[Kernel], buffers: Iterable[Buffer],
    meta: dict[str, Any] | None = None,
) -> KernelGraph:
    return KernelGraph(
        model=model, phase=phase, shape=dict(shape), kernels=tuple(kernels), buffers=tuple(buffers),
        meta=dict(meta or {}),
    )
