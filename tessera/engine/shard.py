"""One worker's share of a model: only its nodes' weights and caches are real.

``build_share`` builds the whole model on the meta device, traces it (the node names are the same in
every process: one program), then replaces every tensor its own nodes touch (``Program.resident``) with a
real one on its device: parameters (a tensor shared by several modules, a tied head and embedding, stays
one tensor), rotary tables (computed), and the KV pages / state slots of its attention and Mamba nodes.
It traces again so the program's get_attr nodes see the real tensors, and loads its parameters by
checkpoint name (``loader.load_named``, only those names) or fills them with dummy weights (each from its
own name's stream, so a share holds exactly what the whole model would). Everything else stays on the
meta device: no memory, never run.

``value_layouts`` says the shape of each node's value for any iteration (so a receiver can size its buffer
before the bytes arrive): its rows are the iteration's tokens T or its sampled rows R (after the logits
gather), then a fixed tail, in a fixed dtype; found by running the program twice under fake tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tessera.engine.arch import ModelArch
from tessera.engine.config import EngineConfig
from tessera.engine.inputs import IterationShape
from tessera.engine.kernels import fake_iteration
from tessera.engine.layers import MambaConv, PagedAttention
from tessera.engine.loader import ModelSource, dummy_fill, load_named
from tessera.engine.models import Mamba2Mixer, construct
from tessera.engine.program import Program

CACHES = ("k_cache", "v_cache", "conv_state", "ssm_state")


@dataclass(frozen=True)
class Layout:
    """A node value's shape for an iteration of T tokens and R sampled rows: [T or R, *tail]."""

    rows: str  # "tokens" | "sampled"
    tail: tuple[int, ...]
    dtype: torch.dtype

    def shape(self, tokens: int, sampled: int) -> tuple[int, ...]:
        return (tokens if self.rows == "tokens" else sampled, *self.tail)


@dataclass(frozen=True)
class Share:
    program: Program
    resident_bytes: int  # real parameters and caches this worker holds
    loaded_bytes: int  # read from the checkpoint (0 for dummy weights)


def build_share(source: ModelSource, dtype: torch.dtype, config: EngineConfig, nodes: set[str],
                device: torch.device | str, *, load_format: str, seed: int) -> Share:
    """The program with real tensors for ``nodes`` only (see the module docstring); on the meta device,
    only their sizes (``resident_bytes``: what a worker holding ``nodes`` would allocate)."""
    with torch.device("meta"):
        model = construct(source.arch, dtype)
    program = Program(model)
    unknown = nodes - set(program.node_names)
    if unknown:
        raise ValueError(f"nodes {sorted(unknown)[:3]} are not in {source.name}'s program")
    mine = [n for n in program.kernels if n.name in nodes]
    owners = _owners(model)
    params = {id(p): name for name, p in model.named_parameters()}
    # every meta tensor the share's nodes touch, held here so that no id is reused while they are replaced
    wanted: dict[int, tuple[str, torch.Tensor]] = {}
    for node in mine:
        for name, t in program.resident(node):
            wanted.setdefault(id(t), (name, t))
    loads: dict[str, torch.Tensor] = {}
    resident = 0
    caches: set[nn.Module] = set()
    for tid, (name, t) in wanted.items():
        if tid in params:
            real = nn.Parameter(torch.empty(t.shape, dtype=t.dtype, device=device), requires_grad=False)
            _replace(owners[tid], real)
            loads[params[tid]] = real
            resident += real.numel() * real.element_size()
        elif name.endswith("inv_freq"):
            _replace(owners[tid], torch.tensor(source.arch.inv_freq, dtype=torch.float32, device=device))
        elif name.rsplit(".", 1)[-1] in CACHES:
            caches.update(m for m, _ in owners[tid])
    for m in caches:  # only this worker's attention, conv and scan modules
        _allocate(m, config, source.arch, dtype, device)
        resident += sum(b.numel() * b.element_size() for k, b in m.named_buffers() if k in CACHES)
    loaded = 0
    if torch.device(device).type == "meta":  # sizes only (memory checks): nothing to fill
        pass
    elif load_format == "dummy":
        for name, t in loads.items():
            dummy_fill(name, t, seed)
    else:
        assert source.directory is not None, "a checkpoint load needs a model directory"
        loaded = load_named(source.directory, {n: [t] for n, t in loads.items()})
    return Share(program=Program(model), resident_bytes=resident, loaded_bytes=loaded)


Owners = dict[int, list[tuple[nn.Module, str]]]


def _owners(model: nn.Module) -> Owners:
    """id(tensor) -> every (module, attribute) holding it as a parameter or buffer."""
    out: Owners = {}
    for m in model.modules():
        for k, t in [*m.named_parameters(recurse=False, remove_duplicate=False),
                     *m.named_buffers(recurse=False, remove_duplicate=False)]:
            out.setdefault(id(t), []).append((m, k))
    return out


def _replace(where: list[tuple[nn.Module, str]], real: torch.Tensor) -> None:
    """Put ``real`` wherever the meta tensor was (every module sharing it: a tied head and embedding stay
    one tensor)."""
    for m, k in where:
        setattr(m, k, real)


def _allocate(m: nn.Module, config: EngineConfig, arch: ModelArch, dtype: torch.dtype,
              device: torch.device | str) -> None:
    if isinstance(m, PagedAttention):
        m.allocate(config.pages(arch), config.page_size, dtype, device)
    elif isinstance(m, MambaConv):
        m.allocate(config.max_num_seqs, dtype, device)
    elif isinstance(m, Mamba2Mixer):
        m.allocate(config.max_num_seqs, device)
    else:
        raise AssertionError(f"{type(m).__name__} holds no cache")


def value_layouts(arch: ModelArch, dtype: torch.dtype, page_size: int) -> dict[str, Layout]:
    """node name -> Layout of its value, from two fake iterations whose token and sampled-row counts
    differ (T = 5 and R = 2, then T = 7 and R = 3)."""
    shapes = []
    for shape in (IterationShape(decode=1, context=3, chunks=1, chunk_len=4),
                  IterationShape(decode=2, context=3, chunks=1, chunk_len=5)):
        with fake_iteration(arch, shape, dtype, page_size) as (program, inputs, _):
            shapes.append({n: (tuple(v.shape), v.dtype) for n, v in program.values(inputs).items()})
    out = {}
    for name, ((a, dt), (b, _)) in {n: (shapes[0][n], shapes[1][n]) for n in shapes[0]}.items():
        rows = "tokens" if (a[0], b[0]) == (5, 7) else "sampled"
        assert (a[0], b[0]) in ((5, 7), (2, 3)) and a[1:] == b[1:], f"value {name}: shapes {a} and {b}"
        out[name] = Layout(rows=rows, tail=a[1:], dtype=dt)
    return out
