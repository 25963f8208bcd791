"""The split executor: kernels run under an assignment node -> device, each device with its own value store
and explicit transfers, give bit-identical logits to the unsplit program at every iteration; a placement the
planner makes on kernel_graph() maps 1:1 onto the nodes and runs the same way."""

from __future__ import annotations

import pytest
import torch

from tessera.engine import EngineConfig, IterationShape, SamplingParams, load_engine
from tessera.engine.kernels import kernel_graph
from tessera.engine.layers import Experts, MambaConv, PagedAttention
from tessera.engine.program import values_crossing

CONFIG = EngineConfig(max_num_seqs=4, max_num_batched_tokens=6, page_size=4, max_model_len=48)
PROMPTS = [[5, 6, 7], list(range(10, 23)), [40] * 9]


def engines(model: str):
    """Two engines with the same random weights (seeded), keeping every iteration's logits."""
    return [load_engine(model, CONFIG, dtype="fp32", load_format="dummy", keep_logits=True) for _ in range(2)]


def attention_side(program) -> tuple[int, ...]:
    """Attention, MoE, conv and scan kernels and the LM head on device 1, the rest on device 0: the hidden
    state crosses twice per layer, and the logits come back to device 0."""
    def on_one(node) -> bool:
        callee = program.callee(node)
        return (isinstance(callee, PagedAttention | Experts | MambaConv) or node.name == "lm_head"
                or callee is torch.ops.tessera_engine.mamba_scan.default)
    return tuple(int(on_one(n)) for n in program.kernels)


def serve_split(engine, assignment: tuple[int, ...], transfers: list[int]):
    def run(inputs):
        out = engine.program.run_split(inputs, assignment, 2)
        transfers.append(len(out.transfers))
        return out.logits
    engine.executor = run
    return engine.generate(PROMPTS, SamplingParams(max_tokens=5, ignore_eos=True))


@pytest.mark.parametrize("model", ["llama-tiny", "moe-tiny", "mamba2-tiny"])
def test_split_equals_unsplit(model):
    whole, split = engines(model)
    expected = whole.generate(PROMPTS, SamplingParams(max_tokens=5, ignore_eos=True))
    assignment = attention_side(split.program)
    crossing = values_crossing(split.program, assignment)
    layers = whole.source.arch.num_layers
    assert len(crossing) >= 2 * layers + 1  # into and out of device 1 in every layer, the logits back
    transfers: list[int] = []
    got = serve_split(split, assignment, transfers)
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    assert len(whole.history) == len(split.history)
    for a, b in zip(whole.history, split.history, strict=True):
        assert a.tokens == b.tokens
        assert torch.equal(a.logits, b.logits)
    assert set(transfers) == {len(crossing)}  # every crossing value copied once per iteration, nothing else


def test_planner_placement_runs_on_the_program():
    """kernel_graph() at an iteration shape, placed by the MILP on two CPU devices: one device per node,
    in node order, and the split run with that placement equals the unsplit one."""
    from tessera.runtime.placements import milp

    whole, split = engines("llama-tiny")
    graph = kernel_graph(split.source.arch, IterationShape(decode=2, context=20, chunks=1, chunk_len=4),
                         model="llama-tiny", dtype=torch.float32, page_size=CONFIG.page_size)
    assert graph.meta["nodes"] == list(split.program.node_names)
    assignment = milp({"mixed": graph}, 2)["mixed"]
    assert len(assignment) == len(split.program.kernels)
    expected = whole.generate(PROMPTS, SamplingParams(max_tokens=5, ignore_eos=True))
    got = serve_split(split, tuple(assignment), [])
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    for a, b in zip(whole.history, split.history, strict=True):
        assert torch.equal(a.logits, b.logits)


def test_split_refuses_a_wrong_assignment():
    engine = engines("llama-tiny")[0]
    n = len(engine.program.kernels)
    with pytest.raises(ValueError, match=f"{n} kernels"):
        engine.program.run_split(None, (0,) * (n - 1), 2)
    with pytest.raises(ValueError, match="over 2 devices"):
        engine.program.run_split(None, (2,) * n, 2)
