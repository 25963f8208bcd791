"""The engine's custom operators: everything that depends on which token belongs to which sequence.

The model programs see one iteration's tokens flattened ([tokens, ...]); per-sequence work lives inside
these ops, so the traced graph has no shape-dependent Python and one op call is one kernel node:

- ``paged_attention``: writes the iteration's K/V into the layer's pages, then attends every query
  causally to its sequence's cached prefix (a prompt chunk against its earlier tokens, a decode token
  against the whole context), with an optional sliding window;
- ``fused_moe``: top-k softmax routing and the selected experts' SiLU MLPs, as transformers runs them;
- ``mamba_conv`` / ``mamba_scan``: Mamba-2's causal depthwise conv and selective scan, each carrying
  its per-slot state (conv history, SSM state) across iterations: chunked (SSD) form for prompt pieces,
  the one-step recurrence for decode tokens, as transformers' torch path does.

Sequence metadata (per-sequence host lists) comes from ``query_start_loc`` [S+1] (cumulative query
tokens) and ``seq_lens`` [S] (tokens of each sequence after this iteration). Implementations are plain
PyTorch; on a CUDA tensor with FlashAttention installed, ``paged_attention`` uses its paged varlen kernel
(an optional import, never needed on CPU). Each op has a fake implementation for ``kernel_graph``.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch import Tensor

# FlashAttention's paged path needs pages of a multiple of 256 tokens (its block_table contract).
FLASH_PAGE_MULTIPLE = 256
HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None


def sequences(query_start_loc: Tensor, seq_lens: Tensor) -> list[tuple[int, int, int]]:
    """(first query row, query tokens, tokens before this iteration) of each sequence."""
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    counts = [starts[i + 1] - starts[i] for i in range(len(lens))]
    return [(starts[i], n, lens[i] - n) for i, n in enumerate(counts)]


# ---- paged attention ------------------------------------------------------------------------------------


@torch.library.custom_op("tessera_engine::paged_attention", mutates_args=("k_cache", "v_cache"))
def paged_attention(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor,
                    block_table: Tensor, query_start_loc: Tensor, seq_lens: Tensor, scale: float,
                    window: int) -> Tensor:
    """q [T, Hq·D], k and v [T, Hkv·D]; caches [pages, page_size, Hkv, D]; slot_mapping [T] (page ·
    page_size + offset of each token's K/V); block_table [S, max pages]. Returns [T, Hq·D]. ``window``
    0 is full causal attention, else a key is seen only if query position − key position < window."""
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    tokens = q.shape[0]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k.view(tokens, kv_heads, head_dim))
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v.view(tokens, kv_heads, head_dim))
    q3 = q.view(tokens, -1, head_dim)
    if q.is_cuda and HAS_FLASH_ATTN and k_cache.shape[1] % FLASH_PAGE_MULTIPLE == 0:
        out = _flash(q3, k_cache, v_cache, block_table, query_start_loc, seq_lens, scale, window)
        return out.reshape(tokens, -1)
    if tokens == seq_lens.shape[0]:  # every sequence decodes one token: nothing read back to the host
        # (the block table is exactly as wide as the longest sequence's pages), so a CUDA graph can hold it
        return _decode_attention(q3, k_cache, v_cache, block_table, seq_lens, scale, window,
                                 block_table.shape[1]).view(tokens, -1)
    out = torch.empty_like(q3)
    seqs = sequences(query_start_loc, seq_lens)
    decode = [i for i, (_, n, _) in enumerate(seqs) if n == 1]
    if decode:
        rows = torch.tensor([seqs[i][0] for i in decode], device=q.device)
        span = -(-max(seqs[i][2] + 1 for i in decode) // k_cache.shape[1])
        out[rows] = _decode_attention(q3[rows], k_cache, v_cache, block_table[decode], seq_lens[decode],
                                      scale, window, span)
    for i, (start, n, before) in enumerate(seqs):
        if n > 1:
            out[start:start + n] = _chunk_attention(q3[start:start + n], k_cache, v_cache, block_table[i],
                                                    before + n, scale, window)
    return out.view(tokens, -1)


@paged_attention.register_fake
def _(q, k, v, k_cache, v_cache, slot_mapping, block_table, query_start_loc, seq_lens, scale, window):
    return torch.empty_like(q)


def _gather(cache: Tensor, pages: Tensor, span: int) -> Tensor:
    """Sequences' first ``span`` pages as [n, Hkv, span · page_size, D] (pages [n, ≥ span]): one copy of the
    cached keys or values, head-major for the matmuls."""
    got = cache[pages[:, :span]]  # [n, span, page, Hkv, D]
    n, _, page, kv_heads, dim = got.shape
    return got.permute(0, 3, 1, 2, 4).reshape(n, kv_heads, span * page, dim)


def _grouped_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, scale: float) -> Tensor:
    """softmax(q·kᵀ·scale, masked)·v with each KV head shared by its group of query heads, without copying
    K/V per query head: q [n, Hq, Lq, D], keys and values [n, Hkv, S, D], mask [n, Lq, S] (True: attend).
    Scores and softmax in fp32. Returns [n, Hq, Lq, D]."""
    n, heads, lq, dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    scores = torch.matmul(q.reshape(n, kv_heads, group * lq, dim), keys.transpose(-1, -2)).float() * scale
    scores = scores.view(n, kv_heads, group, lq, -1).masked_fill(~mask[:, None, None], -torch.inf)
    probs = torch.softmax(scores, dim=-1).to(values.dtype).view(n, kv_heads, group * lq, -1)
    return torch.matmul(probs, values).view(n, heads, lq, dim)


def _chunk_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, pages: Tensor, length: int, scale: float,
                     window: int) -> Tensor:
    """A prompt piece's n queries [n, Hq, D] (the last n of ``length`` positions) against the sequence's
    keys."""
    n = q.shape[0]
    span = -(-length // k_cache.shape[1])
    keys = _gather(k_cache, pages[None], span)[:, :, :length]
    values = _gather(v_cache, pages[None], span)[:, :, :length]
    qpos = torch.arange(length - n, length, device=q.device)[:, None]
    kpos = torch.arange(length, device=q.device)[None, :]
    mask = kpos <= qpos
    if window:
        mask &= kpos > qpos - window
    return _grouped_attention(q.transpose(0, 1)[None], keys, values, mask[None], scale)[0].transpose(0, 1)


def _decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, pages: Tensor, lengths: Tensor,
                      scale: float, window: int, span: int) -> Tensor:
    """n one-token queries [n, Hq, D], each at the last position of its sequence, batched: the sequences'
    first ``span`` pages gathered (the longest one's count), keys beyond a sequence's length masked."""
    page = k_cache.shape[1]
    kpos = torch.arange(span * page, device=q.device)[None, :]
    last = (lengths - 1)[:, None]
    mask = kpos <= last
    if window:
        mask &= kpos > last - window
    keys, values = _gather(k_cache, pages, span), _gather(v_cache, pages, span)
    return _grouped_attention(q[:, :, None], keys, values, mask[:, None, :], scale)[:, :, 0]


def _flash(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, query_start_loc: Tensor,
           seq_lens: Tensor, scale: float, window: int) -> Tensor:
    """FlashAttention's varlen kernel over the paged cache, [T, Hq, D] (GPU only; causal masking aligned to
    each sequence's last key, which is this op's semantics)."""
    from flash_attn import flash_attn_varlen_func

    cu_k = F.pad(seq_lens.cumsum(0), (1, 0)).to(torch.int32)
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    out = flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q=query_start_loc.to(torch.int32),
                                 cu_seqlens_k=cu_k, max_seqlen_q=int(q_lens.max()),
                                 max_seqlen_k=int(seq_lens.max()), softmax_scale=scale, causal=True,
                                 window_size=(window - 1 if window else -1, 0),
                                 block_table=block_table.to(torch.int32))
    return out


# ---- mixture of experts ---------------------------------------------------------------------------------


@torch.library.custom_op("tessera_engine::fused_moe", mutates_args=())
def fused_moe(hidden: Tensor, router_logits: Tensor, w_gate: list[Tensor], w_up: list[Tensor],
              w_down: list[Tensor], top_k: int, renormalize: bool, weights_fp32: bool) -> Tensor:
    """hidden [T, H], router_logits [T, E], expert weights [I, H], [I, H], [H, I] -> [T, H]: each token's
    top-k experts by softmax probability, their SiLU MLP outputs weighted and summed (in expert order,
    accumulated with index_add_, as transformers' experts loop does)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    top_w, top_i = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    if not weights_fp32:
        top_w = top_w.to(router_logits.dtype)
    out = torch.zeros_like(hidden)
    for e in torch.unique(top_i).tolist():
        token, slot = torch.where(top_i == e)
        x = hidden[token]
        h = F.silu(F.linear(x, w_gate[e])) * F.linear(x, w_up[e])
        y = F.linear(h, w_down[e]) * top_w[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out


@fused_moe.register_fake
def _(hidden, router_logits, w_gate, w_up, w_down, top_k, renormalize, weights_fp32):
    return torch.empty_like(hidden)


# ---- Mamba-2 --------------------------------------------------------------------------------------------


@torch.library.custom_op("tessera_engine::mamba_conv", mutates_args=("conv_state",))
def mamba_conv(proj: Tensor, weight: Tensor, bias: Tensor | None, conv_state: Tensor, state_slots: Tensor,
               query_start_loc: Tensor, seq_lens: Tensor, start: int) -> Tensor:
    """Causal depthwise conv + SiLU over the x·B·C channels of in_proj's output.

    proj [T, P] (channels ``start`` .. ``start`` + C are x·B·C); weight [C, 1, K]; conv_state [slots,
    C, K − 1]: each slot's last K − 1 inputs, zeros for a sequence starting here. Returns [T, C]."""
    channels, width = weight.shape[0], weight.shape[2]
    xbc = proj[:, start:start + channels]
    out = torch.empty_like(xbc)
    for i, (first, n, before) in enumerate(sequences(query_start_loc, seq_lens)):
        slot = int(state_slots[i])
        history = conv_state[slot] if before else torch.zeros_like(conv_state[slot])
        full = torch.cat([history, xbc[first:first + n].t()], dim=-1).to(weight.dtype)  # [C, K − 1 + n]
        conv = F.conv1d(full[None], weight, bias, groups=channels)[0]  # [C, n]
        out[first:first + n] = F.silu(conv).t().to(out.dtype)
        conv_state[slot] = full[:, full.shape[1] - (width - 1):]
    return out


@mamba_conv.register_fake
def _(proj, weight, bias, conv_state, state_slots, query_start_loc, seq_lens, start):
    return proj.new_empty((proj.shape[0], weight.shape[0]))


@torch.library.custom_op("tessera_engine::mamba_scan", mutates_args=("ssm_state",))
def mamba_scan(xbc: Tensor, proj: Tensor, a_log: Tensor, d: Tensor, dt_bias: Tensor, ssm_state: Tensor,
               state_slots: Tensor, query_start_loc: Tensor, seq_lens: Tensor, groups: int, chunk_size: int,
               dt_start: int, dt_min: float, dt_max: float) -> Tensor:
    """The selective scan y = SSM(x; dt, A, B, C) + D·x of each sequence, from and into its slot's state.

    xbc [T, C] (x [H·P], then B and C [G·N] each); dt is proj[:, dt_start:dt_start + H]; ssm_state
    [slots, H, P, N] (fp32). Prompt pieces use the chunked form (dt clamped to [dt_min, dt_max]), decode
    tokens the recurrence (not clamped), as transformers' torch path does. Returns y [T, H·P] in fp32."""
    heads, head_dim, state = ssm_state.shape[1], ssm_state.shape[2], ssm_state.shape[3]
    tokens = xbc.shape[0]
    x = xbc[:, :heads * head_dim].view(tokens, heads, head_dim)
    b = xbc[:, heads * head_dim:heads * head_dim + groups * state].view(tokens, groups, state)
    c = xbc[:, heads * head_dim + groups * state:].view(tokens, groups, state)
    dt = proj[:, dt_start:dt_start + heads]
    a = -torch.exp(a_log.float())
    y = torch.empty(tokens, heads, head_dim, dtype=torch.float32, device=xbc.device)
    seqs = sequences(query_start_loc, seq_lens)
    decode = [i for i, (_, n, _) in enumerate(seqs) if n == 1]
    if decode:
        rows = torch.tensor([seqs[i][0] for i in decode], device=xbc.device)
        slots = state_slots[decode]
        y[rows], ssm_state[slots] = _ssm_step(x[rows], dt[rows], a, b[rows], c[rows], d, dt_bias,
                                              ssm_state[slots])
    for i, (first, n, before) in enumerate(seqs):
        if n > 1:
            slot = int(state_slots[i])
            init = ssm_state[slot] if before else None
            rows = slice(first, first + n)
            y[rows], ssm_state[slot] = _ssd_chunked(x[rows], dt[rows], a, b[rows], c[rows], d, dt_bias, init,
                                                    chunk_size, dt_min, dt_max)
    return y.view(tokens, -1)


@mamba_scan.register_fake
def _(xbc, proj, a_log, d, dt_bias, ssm_state, state_slots, query_start_loc, seq_lens, groups, chunk_size,
      dt_start, dt_min, dt_max):
    heads, head_dim = ssm_state.shape[1], ssm_state.shape[2]
    return xbc.new_empty((xbc.shape[0], heads * head_dim), dtype=torch.float32)


def _per_head(t: Tensor, heads: int) -> Tensor:
    """[..., G, N] -> [..., H, N]: head h reads group h // (H / G)."""
    return t.repeat_interleave(heads // t.shape[-2], dim=-2)


def _ssm_step(x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, d: Tensor, dt_bias: Tensor,
              state: Tensor) -> tuple[Tensor, Tensor]:
    """One token of n sequences: state ← state·exp(dt·A) + dt·B·x, y = C·state + D·x (x [n, H, P], dt
    [n, H], B and C [n, G, N], state [n, H, P, N]); returns (y [n, H, P] fp32, the new state)."""
    heads = x.shape[1]
    dt = F.softplus(dt + dt_bias.to(dt.dtype))[..., None]  # [n, H, 1]
    decay = torch.exp(dt.float()[..., None] * a[None, :, None, None])  # [n, H, 1, 1]
    bx = (dt[..., None] * _per_head(b, heads)[:, :, None, :]) * x[..., None]  # [n, H, P, N]
    new = state * decay + bx.float()
    y = (new.to(c.dtype) @ _per_head(c, heads)[..., None])[..., 0]  # [n, H, P]
    return (y + x * d[None, :, None].to(x.dtype)).float(), new.to(state.dtype)


def _segsum(t: Tensor) -> Tensor:
    """[..., L] -> [..., L, L] with out[..., i, j] = t[j+1] + ... + t[i] for i >= j, −inf above."""
    n = t.shape[-1]
    tt = t[..., None].expand(*t.shape, n)
    tt = tt.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool, device=t.device), diagonal=-1), 0)
    out = torch.cumsum(tt, dim=-2)
    return out.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool, device=t.device)), -torch.inf)


def _ssd_chunked(x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, d: Tensor, dt_bias: Tensor,
                 init: Tensor | None, chunk: int, dt_min: float, dt_max: float) -> tuple[Tensor, Tensor]:
    """One sequence's L tokens in the chunked state-space-duality form (Mamba-2's SSD): within a chunk the
    scan is a masked quadratic form, across chunks a recurrence over chunk-final states. x [L, H, P],
    dt [L, H], B and C [L, G, N], init [H, P, N] or None (zeros). Returns (y [L, H, P], final state)."""
    length, heads, _ = x.shape
    dt = torch.clamp(F.softplus(dt + dt_bias.to(dt.dtype)), dt_min, dt_max)
    pad = (chunk - length % chunk) % chunk
    xf = F.pad(x.float(), (0, 0, 0, 0, 0, pad))
    skip = d[:, None] * xf  # D·x
    dtp = F.pad(dt.float(), (0, 0, 0, pad))
    xdt = (xf * dtp[..., None]).view(-1, chunk, heads, x.shape[2])  # [c, l, H, P]
    adt = (a * F.pad(dt.float(), (0, 0, 0, pad))).view(-1, chunk, heads).permute(2, 0, 1)  # [H, c, l]
    bh = F.pad(_per_head(b.float(), heads), (0, 0, 0, 0, 0, pad)).view(-1, chunk, heads, b.shape[2])
    ch = F.pad(_per_head(c.float(), heads), (0, 0, 0, 0, 0, pad)).view(-1, chunk, heads, c.shape[2])
    cum = torch.cumsum(adt, dim=-1)  # [H, c, l]
    # within chunks: scores C_l·B_s decayed by exp(sum of A·dt over (s, l]), applied to x_s·dt_s
    decay_in = torch.exp(_segsum(adt)).permute(1, 2, 3, 0)  # [c, l, s, H]
    y_diag = torch.einsum("clsh,cshp->clhp", torch.einsum("clhn,cshn->clsh", ch, bh) * decay_in, xdt)
    # each chunk's contribution to the state at its end, then the recurrence over chunks
    to_end = torch.exp(cum[:, :, -1:] - cum).permute(1, 2, 0)[..., None]  # [c, l, H, 1]
    chunk_states = torch.einsum("clhn,clhp->chpn", bh * to_end, xdt)
    start = torch.zeros_like(chunk_states[:1]) if init is None else init[None].float()
    states = torch.cat([start, chunk_states], dim=0)  # [c + 1, H, P, N]
    across = torch.exp(_segsum(F.pad(cum[:, :, -1], (1, 0)))).permute(2, 1, 0)  # [source z, target c, H]
    states = torch.einsum("zch,zhpn->chpn", across, states)
    # the state entering each chunk, read out by C and decayed to each position
    y_off = torch.einsum("clhn,chpn->clhp", ch, states[:-1]) * torch.exp(cum).permute(1, 2, 0)[..., None]
    y = (y_diag + y_off).reshape(-1, heads, x.shape[2]) + skip
    return y[:length], states[-1]
