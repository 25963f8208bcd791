"""A model's iteration forward as a torch.fx graph whose call nodes are its kernels, and two executors.

``Program.trace(model)`` symbolically traces the model with the kernel modules (``layers.KERNEL_MODULES``)
as leaves. The graph then holds placeholders (the iteration inputs), get_attr nodes (resident weights
and states a custom op is handed directly) and call nodes, each one kernel: a GEMM, norm, rotary,
activation, residual add, attention, MoE block, conv or scan, the embedding and the logits gather. No
call node depends on a shape, so one graph serves every iteration.

Executors:
- ``Program.__call__``: the graph's generated Python code, the unsplit run.
- ``Program.run_split``: the same nodes under an assignment node -> device, each device with its own
  store of values; a value produced on one device and consumed on another is copied into the consumer's
  store once (a ``SplitCopy``), as a send/receive pair would. Outputs are bit-identical to the unsplit
  run (same operators, same order). Iteration inputs are handed to every device that reads them, and
  the logits end on device 0, where sampling runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx as fx
from torch import Tensor, nn

from tessera.engine.inputs import FIELDS, IterationInputs
from tessera.engine.layers import KERNEL_MODULES

CALLS = ("call_module", "call_function", "call_method")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


class KernelTracer(fx.Tracer):
    """Keeps every kernel module whole: its call is one node."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, KERNEL_MODULES)


@dataclass(frozen=True)
class SplitCopy:
    """A value (its producing node's name) copied from one device's store into another's by ``run_split``
    (what a worker sends is a ``routes.Transfer``, scheduled and tagged)."""

    value: str
    src: int
    dst: int
    nbytes: int


@dataclass(frozen=True)
class SplitRun:
    logits: Tensor
    transfers: tuple[SplitCopy, ...]


class Program:
    """A traced model program; ``kernels`` are its call nodes in program order (kernel i = node i)."""

    def __init__(self, model: nn.Module) -> None:
        graph = KernelTracer().trace(model)
        self.model = model
        self.gm = fx.GraphModule(model, graph)
        self.kernels: tuple[fx.Node, ...] = tuple(n for n in graph.nodes if n.op in CALLS)
        names = [n.target for n in graph.nodes if n.op == "placeholder"]
        if tuple(names) != FIELDS:
            raise ValueError(f"program inputs {names} are not the iteration's {FIELDS}")
        self._canonical = {id(p): name for name, p in model.named_parameters()}

    def __call__(self, inputs: IterationInputs) -> Tensor:
        return self.gm(**inputs.as_dict())

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.kernels)

    # ---- what each node is -------------------------------------------------------------------

    def module_path(self, node: fx.Node) -> str:
        """The kernel module a call_module node runs, else the innermost module whose code made the node."""
        if node.op == "call_module":
            return str(node.target)
        stack = node.meta.get("nn_module_stack") or {}
        return next(reversed(stack.values()))[0] if stack else ""

    def layer_of(self, node: fx.Node) -> int | None:
        m = _LAYER.search(self.module_path(node))
        return int(m.group(1)) if m else None

    def callee(self, node: fx.Node) -> Any:
        """The module, function or method name a call node invokes."""
        return self.gm.get_submodule(node.target) if node.op == "call_module" else node.target

    def resident(self, node: fx.Node) -> list[tuple[str, Tensor]]:
        """(name, tensor) of the parameters and buffers a node touches: its module's, and those handed to it
        through get_attr nodes. Parameters carry their checkpoint name (a tied head's weight is the
        embedding's)."""
        out: list[tuple[str, Tensor]] = []
        if node.op == "call_module":
            mod = self.gm.get_submodule(node.target)
            out += [(self._canonical.get(id(p), f"{node.target}.{n}"), p) for n, p in mod.named_parameters()]
            out += [(f"{node.target}.{n}", b) for n, b in mod.named_buffers()]
        for a in node.all_input_nodes:
            if a.op == "get_attr":
                t = self.attr(a)
                out.append((self._canonical.get(id(t), str(a.target)), t))
        return out

    def parameter_names(self, nodes: Iterable[fx.Node]) -> set[str]:
        """Checkpoint names of the weights ``nodes`` read: what a device running them must load."""
        params = set(self._canonical.values())
        return {name for n in nodes for name, _ in self.resident(n) if name in params}

    # ---- split execution ---------------------------------------------------------------------

    def run_split(self, inputs: IterationInputs, assignment: Sequence[int], devices: int) -> SplitRun:
        """Run the kernels with kernel i on device ``assignment[i]``, each device reading only its own
        store."""
        if len(assignment) != len(self.kernels) or not all(0 <= d < devices for d in assignment):
            raise ValueError(f"assignment of {len(assignment)} kernels over {devices} devices; the program "
                             f"has {len(self.kernels)} kernels")
        feed = inputs.as_dict()
        stores: list[dict[fx.Node, Tensor]] = [{} for _ in range(devices)]
        home: dict[fx.Node, int] = {}
        transfers: list[SplitCopy] = []
        last_use = _last_uses(self.gm.graph)

        def fetch(a: fx.Node, d: int) -> Tensor:
            if a.op == "get_attr":  # resident on the device that runs its consumer
                return self.attr(a)
            store = stores[d]
            if a not in store:
                if a.op == "placeholder":
                    store[a] = feed[str(a.target)]
                else:
                    src = home[a]
                    value = stores[src][a]
                    store[a] = value.clone()  # the receiving device's own copy
                    transfers.append(SplitCopy(a.name, src, d, value.numel() * value.element_size()))
            return store[a]

        for i, (node, d) in enumerate(zip(self.kernels, assignment, strict=True)):
            args = fx.node.map_arg(node.args, lambda a, d=d: fetch(a, d))
            kwargs = fx.node.map_arg(node.kwargs, lambda a, d=d: fetch(a, d))
            stores[d][node] = self.call(node, args, kwargs)
            home[node] = d
            for done in [v for v in last_use.get(i, ()) if v.op != "placeholder"]:
                for s in stores:
                    s.pop(done, None)
        out = next(n for n in self.gm.graph.nodes if n.op == "output").args[0]
        return SplitRun(logits=fetch(out, 0), transfers=tuple(transfers))

    def values(self, feed: dict[str, Tensor]) -> dict[str, Tensor]:
        """Every kernel node's value for one iteration's inputs (by field name), in program order."""
        env: dict[fx.Node, Tensor] = {}

        def fetch(a: fx.Node) -> Tensor:
            if a.op == "placeholder":
                return feed[str(a.target)]
            return self.attr(a) if a.op == "get_attr" else env[a]

        for node in self.kernels:
            args, kwargs = fx.node.map_arg(node.args, fetch), fx.node.map_arg(node.kwargs, fetch)
            env[node] = self.call(node, args, kwargs)
        return {n.name: v for n, v in env.items()}

    def attr(self, node: fx.Node) -> Tensor:
        """The resident tensor a get_attr node names."""
        return _attr(self.gm, str(node.target))

    def call(self, node: fx.Node, args: Any, kwargs: Any) -> Tensor:
        """Run one kernel node on already-fetched arguments."""
        if node.op == "call_module":
            return self.gm.get_submodule(node.target)(*args, **kwargs)
        if node.op == "call_function":
            return node.target(*args, **kwargs)
        return getattr(args[0], node.target)(*args[1:], **kwargs)


def _attr(root: nn.Module, target: str) -> Tensor:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _last_uses(graph: fx.Graph) -> dict[int, list[fx.Node]]:
    """kernel index -> values whose last consumer is that kernel (the output's value is kept)."""
    calls = [n for n in graph.nodes if n.op in CALLS]
    index = {n: i for i, n in enumerate(calls)}
    last: dict[fx.Node, int] = {}
    for n in calls:
        for a in n.all_input_nodes:
            last[a] = index[n]
    out_node = next(n for n in graph.nodes if n.op == "output")
    for a in out_node.all_input_nodes:
        last.pop(a, None)
    by_kernel: dict[int, list[fx.Node]] = {}
    for v, i in last.items():
        by_kernel.setdefault(i, []).append(v)
    return by_kernel


def values_crossing(program: Program, assignment: Sequence[int]) -> list[tuple[str, int, int]]:
    """(value, from device, to device) of every value a placement sends, in program order, the logits'
    return to device 0 last: what each split run's transfers are (inputs and residents excluded)."""
    dev = dict(zip(program.kernels, assignment, strict=True))
    out = []
    for n in program.kernels:
        for a in dict.fromkeys(a for a in n.all_input_nodes if a in dev):
            if dev[a] != dev[n] and (a.name, dev[a], dev[n]) not in out:
                out.append((a.name, dev[a], dev[n]))
    logits = next(n for n in program.gm.graph.nodes if n.op == "output").args[0]
    if dev[logits] != 0:
        out.append((logits.name, dev[logits], 0))
    return out


def device_of(program: Program, assignment: Sequence[int]) -> dict[str, int]:
    """node name -> device, the form a worker's share is described in."""
    return {n.name: int(d) for n, d in zip(program.kernels, assignment, strict=True)}

