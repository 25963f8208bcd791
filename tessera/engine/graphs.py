"""CUDA graphs of a worker's decode segments: runs of its nodes between two transfers, captured once per
iteration shape and replayed (the host then launches one graph instead of a kernel per operator).

Only decode iterations (every sequence one token) are captured, and only nodes whose kernels never read a
value back to the host: the fused MoE (it picks its experts on the host) and Mamba-2's conv and scan (they
read the sequence layout) run eagerly between captured stretches. Paged attention reads nothing back on a
decode iteration (``ops.paged_attention``: its span is the block table's width), so a graph's key is the
segment, the token count, the sampled rows and that width. A segment's inputs are copied into the graph's
own input buffers before each replay and its values cloned out after it, so two groups' iterations in
flight may replay the same graph one after the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch import Tensor

from tessera.engine.layers import Experts, MambaConv
from tessera.engine.program import Program

Fetch = Callable[[fx.Node], Tensor]


def capturable(program: Program, node: fx.Node) -> bool:
    callee = program.callee(node)
    scan = torch.ops.tessera_engine.mamba_scan.default
    return not isinstance(callee, Experts | MambaConv) and callee is not scan


@dataclass
class Captured:
    graph: torch.cuda.CUDAGraph
    inputs: dict[fx.Node, Tensor]
    outputs: dict[fx.Node, Tensor]


class SegmentGraphs:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.graphs: dict[tuple, Captured] = {}
        self.replays = 0
        self.captures = 0

    def run(self, key: tuple, nodes: list[fx.Node], fetch: Fetch) -> dict[str, Tensor]:
        """The segment's node values: replayed from its graph for ``key``, or (first time) run eagerly and
        captured for the next iterations of this shape."""
        hit = self.graphs.get(key)
        if hit is None:
            return self._capture(key, nodes, fetch)
        for a, buf in hit.inputs.items():
            buf.copy_(fetch(a))
        hit.graph.replay()
        self.replays += 1
        return {n.name: v.clone() for n, v in hit.outputs.items()}

    def _eager(self, nodes: list[fx.Node], fetch: Fetch) -> dict[fx.Node, Tensor]:
        env: dict[fx.Node, Tensor] = {}

        def get(a: fx.Node) -> Tensor:
            return env[a] if a in env else fetch(a)

        for n in nodes:
            env[n] = self.program.call(n, fx.node.map_arg(n.args, get), fx.node.map_arg(n.kwargs, get))
        return env

    def _capture(self, key: tuple, nodes: list[fx.Node], fetch: Fetch) -> dict[str, Tensor]:
        inside = set(nodes)
        external = [a for n in nodes for a in n.all_input_nodes if a not in inside and a.op != "get_attr"]
        static = {a: fetch(a).clone() for a in dict.fromkeys(external)}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the warm-up CUDA graphs need, which is this iteration's real run
            values = self._eager(nodes, lambda a: static[a] if a in static else fetch(a))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = self._eager(nodes, lambda a: static[a] if a in static else fetch(a))
        self.graphs[key] = Captured(graph=graph, inputs=static, outputs=outputs)
        self.captures += 1
        return {n.name: v for n, v in values.items()}
