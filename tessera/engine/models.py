"""The model programs, written over one iteration's flattened tokens, under the checkpoints' names.

Every model's forward takes the same iteration inputs (``inputs.FIELDS``) and returns the logits of the
rows ``logits_indices`` selects. Two programs cover the supported types:

- ``DecoderLM``: Llama, Mistral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm), Mixtral and Qwen3-MoE
  (a router GEMM, then one fused-MoE kernel); ``model.embed_tokens``, ``model.layers.N.…``, ``model.norm``,
  ``lm_head`` as in transformers' checkpoints.
- ``Mamba2LM``: ``backbone.embeddings``, ``backbone.layers.N.{norm,mixer.…}``, ``backbone.norm_f``,
  ``lm_head``.

The forward code calls only kernel modules (``layers.KERNEL_MODULES``), ``+`` and one ``index_select``:
``program.trace`` turns it into the graph whose nodes are the kernels.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from tessera.engine import ops
from tessera.engine.arch import ModelArch
from tessera.engine.layers import (
    Expert,
    Experts,
    GatedRMSNorm,
    HeadRMSNorm,
    MambaConv,
    PagedAttention,
    Residual,
    RMSNorm,
    Rotary,
    SiluAndMul,
)

EXPERT_NAMES = {"mixtral": ("w1", "w3", "w2"), "qwen3_moe": ("gate_proj", "up_proj", "down_proj")}


class SelfAttention(nn.Module):
    def __init__(self, arch: ModelArch, layer: int) -> None:
        super().__init__()
        h, d = arch.hidden_size, arch.head_dim
        self.q_proj = nn.Linear(h, arch.num_heads * d, bias=arch.qkv_bias)
        self.k_proj = nn.Linear(h, arch.num_kv_heads * d, bias=arch.qkv_bias)
        self.v_proj = nn.Linear(h, arch.num_kv_heads * d, bias=arch.qkv_bias)
        self.o_proj = nn.Linear(arch.num_heads * d, h, bias=arch.o_bias)
        if arch.qk_norm:
            self.q_norm = HeadRMSNorm(d, arch.norm_eps)
            self.k_norm = HeadRMSNorm(d, arch.norm_eps)
        self.rotary_emb = Rotary(arch.inv_freq, arch.rope_scaling)
        self.attn = PagedAttention(arch.num_kv_heads, d, arch.windows[layer])
        self.qk_norm = arch.qk_norm

    def forward(self, x: Tensor, positions: Tensor, slot_mapping: Tensor, block_table: Tensor,
                query_start_loc: Tensor, seq_lens: Tensor) -> Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(q, positions), self.rotary_emb(k, positions)
        return self.o_proj(self.attn(q, k, v, slot_mapping, block_table, query_start_loc, seq_lens))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x), self.up_proj(x)))


class SparseMoe(nn.Module):
    """Router GEMM (``gate``) then the experts as one kernel."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        moe = arch.moe
        assert moe is not None
        self.gate = nn.Linear(arch.hidden_size, moe.experts, bias=False)
        self.experts = Experts([Expert(arch.hidden_size, moe.intermediate_size, EXPERT_NAMES[moe.style])
                                for _ in range(moe.experts)], moe.top_k, moe.renormalize, moe.weights_fp32)

    def forward(self, x: Tensor) -> Tensor:
        return self.experts(x, self.gate(x))


class DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.norm_eps)
        self.self_attn = SelfAttention(arch, layer)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.norm_eps)
        sparse = arch.moe is not None and arch.moe.layers[layer]
        # the checkpoint's name for the feed-forward block: Mixtral's MoE is block_sparse_moe
        self.ffn_name = "block_sparse_moe" if sparse and arch.moe.style == "mixtral" else "mlp"
        self.add_module(self.ffn_name, SparseMoe(arch) if sparse else
                        MLP(arch.hidden_size, arch.intermediate_size, arch.mlp_bias))

    def forward(self, h: Tensor, positions: Tensor, slot_mapping: Tensor, block_table: Tensor,
                query_start_loc: Tensor, seq_lens: Tensor) -> Tensor:
        h = h + self.self_attn(self.input_layernorm(h), positions, slot_mapping, block_table, query_start_loc,
                               seq_lens)
        return h + getattr(self, self.ffn_name)(self.post_attention_layernorm(h))


class DecoderBody(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(arch, i) for i in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.norm_eps)


class DecoderLM(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.model = DecoderBody(arch)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: Tensor, positions: Tensor, query_start_loc: Tensor, seq_lens: Tensor,
                block_table: Tensor, slot_mapping: Tensor, state_slots: Tensor,
                logits_indices: Tensor) -> Tensor:
        h = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            h = layer(h, positions, slot_mapping, block_table, query_start_loc, seq_lens)
        # norm and head only on the rows that are sampled (the norm is per row, so this is exact)
        return self.lm_head(self.model.norm(h.index_select(0, logits_indices)))


class Mamba2Mixer(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        m = arch.mamba
        assert m is not None
        self.in_proj = nn.Linear(arch.hidden_size, m.proj_size, bias=m.bias)
        self.conv1d = MambaConv(m.conv_dim, m.conv_kernel, m.conv_bias, start=m.intermediate_size)
        self.A_log = nn.Parameter(torch.empty(m.heads))
        self.D = nn.Parameter(torch.empty(m.heads))
        self.dt_bias = nn.Parameter(torch.empty(m.heads))
        self.norm = GatedRMSNorm(m.intermediate_size, m.groups, arch.norm_eps)
        self.out_proj = nn.Linear(m.intermediate_size, arch.hidden_size, bias=m.bias)
        self.register_buffer("ssm_state", torch.empty(0, m.heads, m.head_dim, m.state_size), persistent=False)
        self.spec = m

    def allocate(self, slots: int, device: torch.device | str) -> None:
        # fp32 state whatever the weights' dtype: it accumulates over the whole sequence
        self.ssm_state = torch.zeros(slots, *self.ssm_state.shape[1:], dtype=torch.float32, device=device)

    def forward(self, x: Tensor, state_slots: Tensor, query_start_loc: Tensor, seq_lens: Tensor) -> Tensor:
        m = self.spec
        proj = self.in_proj(x)
        xbc = self.conv1d(proj, state_slots, query_start_loc, seq_lens)
        dt_start = m.intermediate_size + m.conv_dim
        y = ops.mamba_scan(xbc, proj, self.A_log, self.D, self.dt_bias, self.ssm_state, state_slots,
                           query_start_loc, seq_lens, m.groups, m.chunk_size, dt_start, m.dt_min, m.dt_max)
        return self.out_proj(self.norm(y, proj))


class Mamba2Block(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.norm = RMSNorm(arch.hidden_size, arch.norm_eps, cast_input=True)
        self.mixer = Mamba2Mixer(arch)
        self.residual = Residual(arch.mamba.residual_fp32)

    def forward(self, h: Tensor, state_slots: Tensor, query_start_loc: Tensor, seq_lens: Tensor) -> Tensor:
        return self.residual(h, self.mixer(self.norm(h), state_slots, query_start_loc, seq_lens))


class Mamba2Body(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(Mamba2Block(arch) for _ in range(arch.num_layers))
        self.norm_f = RMSNorm(arch.hidden_size, arch.norm_eps, cast_output=True)


class Mamba2LM(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.backbone = Mamba2Body(arch)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.backbone.embeddings.weight

    def forward(self, input_ids: Tensor, positions: Tensor, query_start_loc: Tensor, seq_lens: Tensor,
                block_table: Tensor, slot_mapping: Tensor, state_slots: Tensor,
                logits_indices: Tensor) -> Tensor:
        h = self.backbone.embeddings(input_ids)
        for layer in self.backbone.layers:
            h = layer(h, state_slots, query_start_loc, seq_lens)
        return self.lm_head(self.backbone.norm_f(h.index_select(0, logits_indices)))


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def construct(arch: ModelArch, dtype: torch.dtype) -> nn.Module:
    """The program's module with parameters in ``dtype`` on the current default device (under fake tensors:
    fake ones, which ``kernel_graph`` uses; their random initialisation costs nothing there)."""
    with default_dtype(dtype):
        return (DecoderLM if arch.family == "decoder" else Mamba2LM)(arch).eval().requires_grad_(False)


def build_model(arch: ModelArch, dtype: torch.dtype, device: torch.device | str) -> nn.Module:
    """The program's module with uninitialised weights in ``dtype`` on ``device`` (to be loaded or filled
    in place), its computed buffers (rotary tables) set, its caches still empty (``allocate_caches``)."""
    with torch.device("meta"):
        model = construct(arch, dtype)
    model = model.to_empty(device=device)
    if arch.tie_word_embeddings:  # to_empty makes a new tensor per module: tie the head again
        body = model.model.embed_tokens if arch.family == "decoder" else model.backbone.embeddings
        model.lm_head.weight = body.weight
    for m in model.modules():
        if isinstance(m, Rotary):  # computed, never loaded, always fp32
            m.inv_freq = torch.tensor(arch.inv_freq, dtype=torch.float32, device=device)
    return model


def allocate_caches(model: nn.Module, *, pages: int, page_size: int, slots: int, dtype: torch.dtype,
                    device: torch.device | str) -> None:
    """KV pages for every attention layer, per-slot conv and SSM states for every Mamba-2 mixer."""
    for m in model.modules():
        if isinstance(m, PagedAttention):
            m.allocate(pages, page_size, dtype, device)
        elif isinstance(m, MambaConv):
            m.allocate(slots, dtype, device)
        elif isinstance(m, Mamba2Mixer):
            m.allocate(slots, device)


def weight_bytes(arch: ModelArch, dtype: torch.dtype) -> int:
    """Bytes of the model's parameters in ``dtype`` (counted on the meta device: nothing allocated)."""
    with torch.device("meta"):
        model = construct(arch, dtype)
    elem = torch.empty(0, dtype=dtype).element_size()
    return sum(p.numel() for p in model.parameters()) * elem
