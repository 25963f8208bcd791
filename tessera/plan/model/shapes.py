"""Shapes of one serving iteration, and the kernel graph of a micro-batch at any shape from one capture.

A continuous-batching engine (vLLM v1, Sarathi-Serve) runs *iterations*: every running sequence decodes
one token and, in the same iteration, a chunk of some waiting prompt is prefilled. The GEMMs, norms and
element-wise kernels see all tokens of the iteration at once (decode tokens + chunk tokens, flattened as
vLLM does); attention is the only kernel whose work depends on which token belongs to which sequence.

So one capture is enough per model: a decode step at a reference batch R (or, for diffusion and vision
encoders, a step at R images). ``iteration_graph`` rescales it to a micro-batch's shape:
  - token-parallel kernels: FLOPs and activation bytes × s, s = tokens / R; GEMM ``m`` and ``numel`` × s;
    resident (weight) bytes a kernel reads are not scaled (weights are read once per iteration);
  - each attention kernel becomes up to two kernels with the same reads and writes: decode attention
    (``decode`` sequences, q_len 1, at the mean ``context``) and the chunk's causal attention (q_len
    ``chunk`` against ``prefix`` earlier tokens); FLOPs 4·heads·head_dim·(query·key pairs);
  - KV buffers hold ``kv_tokens`` tokens (bytes per token from the capture); state buffers (SSM) one
    entry per sequence; kernels that update a recurrent state scale with sequences, not tokens
    (per_sequence_kernels: a chunked scan touches the state once per prompt piece).
Image steps (``images`` > 0) scale every kernel, attention included, by images / R.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields, replace

from tessera.graph import Buffer, Kernel, KernelGraph, KernelKind, Role, build_graph

ATTENTION_KINDS = (KernelKind.ATTENTION, KernelKind.ATTENTION_DECODE)


@dataclass(frozen=True, kw_only=True)
class IterShape:
    """One micro-batch's iteration. Token counts are per micro-batch."""

    decode: int = 0  # sequences decoding one token each
    context: int = 0  # mean KV length the decoding sequences attend to
    chunk: int = 0  # prefill tokens in this iteration
    chunk_len: int = 0  # tokens of one prompt in the chunk (0: the whole chunk is one prompt's piece)
    prefix: int = 0  # mean number of earlier prompt tokens a chunk piece attends to
    kv_tokens: int = 0  # KV tokens resident for this micro-batch (all its sequences, memory)
    images: int = 0  # image steps (denoise / encode): images in the micro-batch
    encode_images: float = 0.0  # a VLM's prompts: images its vision tower encodes this iteration (mean)

    def __post_init__(self) -> None:
        for k in ("decode", "context", "chunk", "chunk_len", "prefix", "kv_tokens", "images", "encode_images"):
            if getattr(self, k) < 0:
                raise ValueError(f"IterShape {k}={getattr(self, k)} must be >= 0")
        if self.images and (self.decode or self.chunk):
            raise ValueError(f"IterShape: images={self.images} excludes decode={self.decode}/chunk={self.chunk}")
        if self.encode_images and not self.chunk:
            raise ValueError(f"IterShape: encode_images={self.encode_images} needs a prefill chunk")
        if not (self.images or self.decode or self.chunk):
            raise ValueError("IterShape: an iteration needs decode sequences, a chunk or images")

    @property
    def tokens(self) -> int:
        return self.decode + self.chunk

    @property
    def pieces(self) -> int:
        """Prompts the chunk holds pieces of."""
        return math.ceil(self.chunk / (self.chunk_len or self.chunk)) if self.chunk else 0

    @property
    def sequences(self) -> int:
        """Sequences whose state the micro-batch holds (decoding ones + the ones being prefilled)."""
        return self.decode + self.pieces


def _elem_bytes(dtype: str) -> int:
    return 4 if "32" in dtype else 1 if "8" in dtype else 2


def attention_kernels(k: Kernel, shape: IterShape) -> list[Kernel]:
    """The decode and chunk attention kernels replacing captured attention kernel ``k`` (ids unset). Both
    are always there, so every iteration graph of a model has the same kernels (one placement fits all
    shapes); a part with no work (no decode sequences, or no chunk) is a launch with nothing to do."""
    d = k.dims
    heads, kvh, hd = d.get("heads", 1), d.get("kv_heads", d.get("heads", 1)), d.get("head_dim", 64)
    # FLOPs per (query, key) pair and head: 2·hd for QKᵀ + 2·hd for PV. Absorbed MLA (dims "latent" = r):
    # scores over the latent + rope (hd), values over the latent alone; its cache is one tensor, not K and V.
    out_dim = d.get("latent", hd)
    qk_pv, kv_tensors = 2 * hd + 2 * out_dim, 1 if "latent" in d else 2
    e = _elem_bytes(k.dtype)
    empty = _with(k, kind=KernelKind.OTHER, flops=0, bytes_read=0, bytes_written=0, dims={})
    out = []
    if not shape.decode:
        out.append(_with(empty, name=k.name + "[no decode]"))
    else:
        n, ctx = shape.decode, max(1, shape.context)
        out.append(_with(k, kind=KernelKind.ATTENTION_DECODE, flops=n * ctx * heads * qk_pv,
                           bytes_read=(n * heads * hd + n * ctx * kvh * hd * kv_tensors) * e,
                           bytes_written=n * heads * out_dim * e,
                           dims={"batch": n, "heads": heads, "kv_heads": kvh, "q_len": 1, "kv_len": ctx,
                                 "head_dim": hd}))
    if not shape.chunk:
        out.append(_with(empty, name=k.name + "[no chunk]"))
    else:
        q, p = min(shape.chunk_len or shape.chunk, shape.chunk), shape.prefix
        n = math.ceil(shape.chunk / q)  # prompts (pieces) in the chunk
        pairs = q * p + q * (q + 1) // 2  # causal: token i of a piece sees the prefix and i piece tokens
        out.append(_with(k, kind=KernelKind.ATTENTION, name=k.name + "[chunk]", flops=heads * qk_pv * pairs * n,
                           bytes_read=n * (q * heads * hd + (p + q) * kvh * hd * kv_tensors) * e,
                           bytes_written=n * q * heads * out_dim * e,
                           dims={"batch": n, "heads": heads, "kv_heads": kvh, "q_len": q, "kv_len": p + q,
                                 "head_dim": hd}))
    return out


def _with(obj, **changes):
    """``dataclasses.replace`` without re-running ``__init__``/``__post_init__``: a rescaled graph has
    ~10⁵ kernels and buffers, and every changed value here is a non-negative scaling of a validated one.
    Only the fields are copied: what the original worked out from them and kept beside them is not the
    copy's."""
    new = object.__new__(type(obj))
    d = new.__dict__  # frozen: __dict__ cannot be rebound, only filled
    names = field_names(type(obj))
    d.update((k, v) for k, v in obj.__dict__.items() if k in names)
    d.update(changes)
    return new


@functools.cache
def field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


_facts: dict[int, tuple[KernelGraph, set[int], list[int]]] = {}


def base_facts(base: KernelGraph) -> tuple[set[int], list[int]]:
    """(per-sequence kernels, resident bytes each kernel reads) of a capture, worked out once per capture:
    every iteration graph rescaled from it needs them."""
    hit = _facts.get(id(base))
    if hit is None or hit[0] is not base:
        resident = {b.id for b in base.buffers if b.role == Role.WEIGHT}
        reads = [sum(base.buffers[b].bytes for b in k.reads if b in resident) for k in base.kernels]
        hit = _facts[id(base)] = (base, per_sequence_kernels(base), reads)
    return hit[1], hit[2]


def _scaled_moe(k: Kernel, s: float, kid: int) -> Kernel:
    """A fused MoE kernel (dims tokens, topk, experts, expert_bytes) at s× its tokens: FLOPs and activation
    bytes × s; the expert weights read are those of the experts the tokens touch, E·(1 − (1 − k/E)^T)
    under uniform top-k routing (the expectation capture priced it with)."""
    d = k.dims
    tokens = max(1, math.ceil(d["tokens"] * s - 1e-9))

    def weights(t: float) -> float:
        return d["experts"] * (1.0 - (1.0 - d["topk"] / d["experts"]) ** t) * d["expert_bytes"]

    act = max(0.0, k.bytes_read - weights(d["tokens"]))
    return _with(k, id=kid, flops=int(k.flops * s), bytes_read=int(weights(tokens) + act * s),
                 bytes_written=int(k.bytes_written * s), dims={**d, "tokens": tokens})


def scaled_kernel(k: Kernel, s: float, resident_read: int, kid: int) -> Kernel:
    if "expert_bytes" in k.dims:
        return _scaled_moe(k, s, kid)
    fixed = min(resident_read, k.bytes_read)
    dims = dict(k.dims)
    for key in ("m", "numel"):
        if key in dims:
            dims[key] = max(1, math.ceil(dims[key] * s - 1e-9))
    return _with(k, id=kid, flops=int(k.flops * s), bytes_read=int(fixed + (k.bytes_read - fixed) * s),
                 bytes_written=int(k.bytes_written * s), dims=dims)


def _scaled_buffer(b: Buffer, s: float, base: KernelGraph, shape: IterShape) -> Buffer:
    if b.role == Role.WEIGHT:
        return b
    r = base.shape.get("batch", 1)
    if b.role == Role.KV and not shape.images:
        slots = base.shape.get("context", 0) + base.shape.get("seq", 1)  # decode cache: context + 1 slots
        per_token = b.bytes / max(1, r * slots)
        return _with(b, bytes=max(1, math.ceil(per_token * shape.kv_tokens)))
    if b.role in (Role.KV, Role.STATE):
        n = shape.images or shape.sequences
        return _with(b, bytes=max(1, math.ceil(b.bytes * n / r)))
    return _with(b, bytes=max(1, math.ceil(b.bytes * s)))


class BufferScaler:
    """A capture's buffers at any shape, by group: weights as captured, KV by the KV tokens held (images:
    by images), recurrent state by sequences (images), activations by the token factor s. Each group's
    rescaled buffers are built once per distinct factor and shared by every graph with that factor (they
    are frozen): a knee samples many shapes of one token count, and most shapes hold no KV."""

    MAX_FACTORS = 256  # rescaled groups kept per capture; past that, the oldest are dropped

    def __init__(self, base: KernelGraph) -> None:
        self.base = base
        kv = [b.id for b in base.buffers if b.role == Role.KV]
        state = [b.id for b in base.buffers if b.role == Role.STATE]
        act = [b.id for b in base.buffers if b.role not in (Role.WEIGHT, Role.KV, Role.STATE)]
        self.groups = (kv, state, act)
        self.made: dict[tuple, tuple[Buffer, ...]] = {}  # (group, factor) -> its rescaled buffers

    def group(self, g: int, key: tuple, s: float, shape: IterShape) -> tuple[Buffer, ...]:
        hit = self.made.get((g, key))
        if hit is None:
            if len(self.made) >= self.MAX_FACTORS:
                self.made.pop(next(iter(self.made)))
            bufs = self.base.buffers
            hit = self.made[g, key] = tuple(_scaled_buffer(bufs[i], s, self.base, shape) for i in self.groups[g])
        return hit

    def at(self, s: float, shape: IterShape) -> list[Buffer]:
        """The buffers of the graph at token factor ``s`` and ``shape`` (what _scaled_buffer gives each)."""
        count = shape.images or shape.sequences
        keys = (("kv", shape.kv_tokens) if not shape.images else ("n", count), ("n", count), ("s", s))
        out = list(self.base.buffers)
        for g, key in enumerate(keys):
            for i, b in zip(self.groups[g], self.group(g, key, s, shape), strict=True):
                out[i] = b
        return out


_scalers: dict[int, BufferScaler] = {}


def scaled_buffers(base: KernelGraph, s: float, shape: IterShape) -> list[Buffer]:
    """``base``'s buffers rescaled to ``shape`` (token factor ``s``), through its BufferScaler."""
    sc = _scalers.get(id(base))
    if sc is None or sc.base is not base:
        sc = _scalers[id(base)] = BufferScaler(base)
    return sc.at(s, shape)


STATE_MIN_BYTES = 4096  # smaller state buffers are counters (a static cache's length), not recurrent state


def per_sequence_kernels(base: KernelGraph) -> set[int]:
    """Kernels whose work is per sequence, not per token: they read or write a recurrent state (an SSM's
    state update, its conv window), or are batched GEMMs (batch > 1: per sequence × head) in a layer that
    holds such a state. A decode token runs them once per sequence; a prefill chunk, with a chunked scan,
    once per prompt piece: they scale with the sequences of the iteration, not its tokens."""
    big = {b.id for b in base.buffers if b.role == Role.STATE and b.bytes >= STATE_MIN_BYTES}
    touch = {k.id for k in base.kernels if big & {*k.reads, *k.writes}}
    layers = {base.kernels[i].layer for i in touch} - {None}
    batched = {k.id for k in base.kernels if k.kind is KernelKind.GEMM and k.dims.get("batch", 1) > 1
               and k.layer in layers}
    return touch | batched


def iteration_graph(base: KernelGraph, shape: IterShape, encoder: KernelGraph | None = None) -> KernelGraph:
    """The graph of one micro-batch's iteration at ``shape``, rescaled from ``base`` (see module doc).

    ``base`` is a decode capture (one token per sequence) for token shapes, or an image step for
    ``shape.images``; its ``shape["batch"]`` is the reference R. ``encoder``: a VLM's vision-tower capture
    (an encode step), run first on ``shape.encode_images`` images (with_encoder).
    """
    if shape.encode_images:
        if encoder is None:
            raise ValueError(f"IterShape encode_images={shape.encode_images} needs the vision tower's capture")
        return with_encoder(iteration_graph(base, replace(shape, encode_images=0.0)), encoder, shape.encode_images)
    r = base.shape.get("batch", 1)
    if shape.images:
        s = shape.images / r
    else:
        if base.shape.get("seq", 1) != 1:
            raise ValueError(f"iteration_graph needs a decode capture (seq 1), got shape {base.shape}")
        s = shape.tokens / r
    per_seq, resident_read = base_facts(base)
    s_seq = shape.sequences / r
    kernels: list[Kernel] = []
    for k in base.kernels:
        if k.kind in ATTENTION_KINDS and not shape.images:
            n = len(kernels)
            kernels.extend([_with(p, id=n + i) for i, p in enumerate(attention_kernels(k, shape))])
        else:
            f = s_seq if k.id in per_seq and not shape.images else s
            kernels.append(scaled_kernel(k, f, resident_read[k.id], len(kernels)))
    buffers = scaled_buffers(base, s, shape)
    dims = {"batch": shape.images or shape.decode, "chunk": shape.chunk, "context": shape.context,
            "prefix": shape.prefix, "kv_tokens": shape.kv_tokens, "tokens": shape.images or shape.tokens}
    return build_graph(model=base.model, phase="mixed" if not shape.images else base.phase, shape=dims,
                       kernels=kernels, buffers=buffers, meta={**base.meta, "rescaled_from": dict(base.shape)})


def with_encoder(lm: KernelGraph, encoder: KernelGraph, images: float) -> KernelGraph:
    """A VLM's iteration: its vision tower on ``images`` images (mean per iteration), then the language
    model's iteration ``lm``. Both captures list every weight of the model by name: the tower's kernels read
    the LM graph's weight buffers (memory counts each once); its other buffers are appended. Its output (the
    image embeddings) becomes an activation that the LM's first kernel (the token embedding, where vLLM
    merges image embeddings in) reads, so a placement that splits them pays the transfer.
    Scaling, from a capture of R images: ≥ R images, FLOPs and activations × images / R with weights read
    once; fewer, the whole step × images / R (the tower runs on one image every R / images iterations)."""
    s = images / encoder.shape.get("batch", 1)
    by_name = {b.name: b.id for b in lm.buffers if b.role == Role.WEIGHT}
    remap: dict[int, int] = {}
    extra: list[Buffer] = []
    for b in encoder.buffers:
        if b.role == Role.WEIGHT and b.name in by_name:
            remap[b.id] = by_name[b.name]
            continue
        remap[b.id] = len(lm.buffers) + len(extra)
        role = Role.ACTIVATION if b.role == Role.OUTPUT else b.role
        extra.append(_with(b, id=remap[b.id], role=role, bytes=max(1, math.ceil(b.bytes * s))))
    resident = {b.id for b in encoder.buffers if b.role == Role.WEIGHT}
    kernels: list[Kernel] = []
    for k in encoder.kernels:
        fixed = sum(encoder.buffers[b].bytes for b in k.reads if b in resident) if s >= 1 else 0
        sk = scaled_kernel(k, s, fixed, k.id)
        kernels.append(_with(sk, reads=tuple(remap[b] for b in k.reads), writes=tuple(remap[b] for b in k.writes)))
    out = {remap[b.id] for b in encoder.buffers if b.role == Role.OUTPUT}
    n = len(kernels)
    for i, k in enumerate(lm.kernels):
        reads = k.reads + tuple(sorted(out)) if i == 0 else k.reads
        kernels.append(_with(k, id=n + i, reads=reads))
    return build_graph(model=lm.model, phase=lm.phase, shape={**lm.shape, "encode_images": images},
                       kernels=kernels, buffers=[*lm.buffers, *extra],
                       meta={**lm.meta, "encoder_from": dict(encoder.shape)})
