"""Llama-like (and Mamba-like) layered KernelGraphs built by hand: for tests and for when capture is absent.

Shapes follow the real architecture (GEMM flops 2·m·n·k, bf16 bytes, KV cache batch×context×kv_heads×
head_dim), so plans on them behave like plans on captures; the kernel list per layer mirrors a HF Llama
decoder layer (norm, q/k/v, rope, cache write, attention, o_proj, residual, norm, gate/up, act, down, add).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.contracts.enums import Phase
from tessera.graph import Buffer, Kernel, KernelGraph, KernelKind, Role, build_graph

BF16 = 2


@dataclass(frozen=True, kw_only=True)
class SynthConfig:
    layers: int = 4
    hidden: int = 4096
    ffn: int = 14336
    heads: int = 32
    kv_heads: int = 8
    vocab: int = 32000
    ssm: bool = False  # Mamba-like: a state buffer per layer instead of KV, no attention


class _Builder:
    def __init__(self) -> None:
        self.bufs: list[Buffer] = []
        self.kers: list[Kernel] = []

    def buf(self, name: str, nbytes: int, role: Role) -> int:
        self.bufs.append(Buffer(id=len(self.bufs), name=name, bytes=int(nbytes), role=role))
        return len(self.bufs) - 1

    def kernel(self, name: str, kind: KernelKind, reads: tuple[int, ...], writes: tuple[int, ...], *,
               flops: int = 0, layer: int | None, module: str, dims: dict[str, int] | None = None) -> None:
        rb = sum(self.bufs[b].bytes for b in reads)
        wb = sum(self.bufs[b].bytes for b in writes)
        self.kers.append(Kernel(id=len(self.kers), name=name, kind=kind, flops=int(flops), bytes_read=rb,
                                bytes_written=wb, reads=reads, writes=writes, layer=layer, module=module,
                                dims=dims or {}))

    def gemm(self, x: int, w: int, rows: int, n: int, k: int, out: str, layer: int | None, module: str) -> int:
        o = self.buf(out, rows * n * BF16, Role.ACTIVATION)
        self.kernel("aten.mm.default", KernelKind.GEMM, (x, w), (o,), flops=2 * rows * n * k, layer=layer,
                    module=module, dims={"m": rows, "n": n, "k": k})
        return o

    def ew(self, name: str, kind: KernelKind, reads: tuple[int, ...], nbytes: int, out: str,
           layer: int | None, module: str) -> int:
        o = self.buf(out, nbytes, Role.ACTIVATION)
        self.kernel(name, kind, reads, (o,), flops=nbytes, layer=layer, module=module,
                    dims={"numel": nbytes // BF16})
        return o


def llama_like(phase: str, *, batch: int, seq: int = 1, context: int = 1024,
               cfg: SynthConfig | None = None, model: str = "synthetic-llama") -> KernelGraph:
    """One step: prefill (``seq`` prompt tokens per sequence) or decode (1 token, ``context`` cached)."""
    assert phase in (Phase.PREFILL, Phase.DECODE), phase
    c = cfg or SynthConfig()
    b = _Builder()
    q_len = seq if phase == Phase.PREFILL else 1
    kv_len = seq if phase == Phase.PREFILL else context
    rows = batch * q_len
    hd = c.hidden // c.heads
    act = rows * c.hidden * BF16
    ids = b.buf("input_ids", rows * 8, Role.INPUT)
    emb = b.buf("model.embed_tokens.weight", c.vocab * c.hidden * BF16, Role.WEIGHT)
    h = b.buf("h0", act, Role.ACTIVATION)
    b.kernel("aten.embedding.default", KernelKind.EMBEDDING, (emb, ids), (h,), layer=None,
             module="model.embed_tokens", dims={"numel": rows * c.hidden})
    pos = b.buf("position_ids", rows * 8, Role.INPUT)
    rope = b.ew("aten.cos.default", KernelKind.ELEMENTWISE, (pos,), rows * hd * BF16 * 2, "rope_cos_sin", None,
                "model.rotary_emb")
    for li in range(c.layers):
        p = f"model.layers.{li}"
        w = {n: b.buf(f"{p}.{n}.weight", s, Role.WEIGHT) for n, s in (
            ("input_layernorm", c.hidden * BF16), ("post_attention_layernorm", c.hidden * BF16))}
        a1 = b.ew("aten.rms_norm.default", KernelKind.NORM, (h, w["input_layernorm"]), act, f"{p}.a1", li,
                  f"{p}.input_layernorm")
        if c.ssm:
            win = b.buf(f"{p}.mixer.in_proj.weight", c.hidden * 2 * c.hidden * BF16, Role.WEIGHT)
            xz = b.gemm(a1, win, rows, 2 * c.hidden, c.hidden, f"{p}.xz", li, f"{p}.mixer.in_proj")
            st = b.buf(f"{p}.mixer.ssm_state", batch * c.hidden * 128 * BF16, Role.STATE)
            y = b.buf(f"{p}.y", act, Role.ACTIVATION)
            b.kernel("mamba_chunk_scan", KernelKind.SCAN, (xz, st), (y, st), flops=rows * c.hidden * 128 * 6,
                     layer=li, module=f"{p}.mixer", dims={"numel": rows * c.hidden})
            wout = b.buf(f"{p}.mixer.out_proj.weight", c.hidden * c.hidden * BF16, Role.WEIGHT)
            o2 = b.gemm(y, wout, rows, c.hidden, c.hidden, f"{p}.o2", li, f"{p}.mixer.out_proj")
        else:
            ws = {n: b.buf(f"{p}.self_attn.{n}.weight", c.hidden * o * BF16, Role.WEIGHT) for n, o in (
                ("q_proj", c.hidden), ("k_proj", c.kv_heads * hd), ("v_proj", c.kv_heads * hd),
                ("o_proj", c.hidden))}
            q = b.gemm(a1, ws["q_proj"], rows, c.hidden, c.hidden, f"{p}.q", li, f"{p}.self_attn.q_proj")
            k = b.gemm(a1, ws["k_proj"], rows, c.kv_heads * hd, c.hidden, f"{p}.k", li, f"{p}.self_attn.k_proj")
            v = b.gemm(a1, ws["v_proj"], rows, c.kv_heads * hd, c.hidden, f"{p}.v", li, f"{p}.self_attn.v_proj")
            q2 = b.ew("aten.mul.Tensor", KernelKind.ELEMENTWISE, (q, rope), act, f"{p}.q_rot", li, f"{p}.self_attn")
            k2 = b.ew("aten.mul.Tensor", KernelKind.ELEMENTWISE, (k, rope), rows * c.kv_heads * hd * BF16,
                      f"{p}.k_rot", li, f"{p}.self_attn")
            cache_bytes = batch * max(context, kv_len) * c.kv_heads * hd * BF16
            kc = b.buf(f"{p}.self_attn.k_cache", cache_bytes, Role.KV)
            vc = b.buf(f"{p}.self_attn.v_cache", cache_bytes, Role.KV)
            for src, cache in ((k2, kc), (v, vc)):
                b.kernel("aten.index_copy_.default", KernelKind.COPY, (cache, src), (cache,), layer=li,
                         module=f"{p}.self_attn", dims={"numel": rows * c.kv_heads * hd})
            o = b.buf(f"{p}.attn", act, Role.ACTIVATION)
            kind = KernelKind.ATTENTION if phase == Phase.PREFILL else KernelKind.ATTENTION_DECODE
            b.kernel("aten._scaled_dot_product_flash_attention.default", kind, (q2, kc, vc), (o,),
                     flops=4 * batch * c.heads * q_len * kv_len * hd, layer=li, module=f"{p}.self_attn",
                     dims={"batch": batch, "heads": c.heads, "kv_heads": c.kv_heads, "q_len": q_len,
                           "kv_len": kv_len, "head_dim": hd})
            o2 = b.gemm(o, ws["o_proj"], rows, c.hidden, c.hidden, f"{p}.o2", li, f"{p}.self_attn.o_proj")
        h1 = b.ew("aten.add.Tensor", KernelKind.ELEMENTWISE, (h, o2), act, f"{p}.h1", li, p)
        a2 = b.ew("aten.rms_norm.default", KernelKind.NORM, (h1, w["post_attention_layernorm"]), act, f"{p}.a2",
                  li, f"{p}.post_attention_layernorm")
        wm = {n: b.buf(f"{p}.mlp.{n}.weight", c.hidden * c.ffn * BF16, Role.WEIGHT)
              for n in ("gate_proj", "up_proj", "down_proj")}
        g = b.gemm(a2, wm["gate_proj"], rows, c.ffn, c.hidden, f"{p}.g", li, f"{p}.mlp.gate_proj")
        u = b.gemm(a2, wm["up_proj"], rows, c.ffn, c.hidden, f"{p}.u", li, f"{p}.mlp.up_proj")
        s = b.ew("aten.mul.Tensor", KernelKind.ELEMENTWISE, (g, u), rows * c.ffn * BF16, f"{p}.s", li, f"{p}.mlp")
        dn = b.gemm(s, wm["down_proj"], rows, c.hidden, c.ffn, f"{p}.dn", li, f"{p}.mlp.down_proj")
        h = b.ew("aten.add.Tensor", KernelKind.ELEMENTWISE, (h1, dn), act, f"{p}.out", li, p)
    wn = b.buf("model.norm.weight", c.hidden * BF16, Role.WEIGHT)
    f = b.ew("aten.rms_norm.default", KernelKind.NORM, (h, wn), act, "final", None, "model.norm")
    wl = b.buf("lm_head.weight", c.vocab * c.hidden * BF16, Role.WEIGHT)
    lg = b.buf("logits", batch * c.vocab * 4, Role.OUTPUT)
    b.kernel("aten.mm.default", KernelKind.GEMM, (f, wl), (lg,), flops=2 * batch * c.vocab * c.hidden,
             layer=None, module="lm_head", dims={"m": batch, "n": c.vocab, "k": c.hidden})
    return build_graph(model=model, phase=phase, shape={"batch": batch, "seq": seq, "context": context},
                       kernels=b.kers, buffers=b.bufs)
