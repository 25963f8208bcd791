"""Placements over two or more devices, for tests, benchmarks and `tessera run MODEL`: the hand-made splits
the issue compares (attention-type kernels on one device and GEMMs on the other, a contiguous layer split)
and the MILP's plan of the very graphs the runtime captured (tessera.plan's solver, CPU cost profile).
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tessera.contracts.enums import Objective, Phase
from tessera.contracts.plan import Plan
from tessera.cost import CostModel
from tessera.errors import UserError, choices_error
from tessera.graph import KernelGraph, KernelKind, Role
from tessera.hardware import LinkSpec
from tessera.plan import is_attention_kernel, plan_graph

if TYPE_CHECKING:
    from tessera.runtime.program import CapturedProgram  # torch: for the annotation only


def attention_gemm(graph: KernelGraph, devices: int = 2) -> tuple[int, ...]:
    """Attention-type kernels (and the ones touching KV/state: the planner's attention/FFN baseline's
    predicate, is_attention_kernel) on device 0, GEMMs on device 1; any other kernel follows the kernel
    before it, so elementwise chains stay with their producer."""
    assert devices >= 2, "attention/GEMM split needs two devices"
    out: list[int] = []
    for k in graph.kernels:
        if is_attention_kernel(graph, k.id):
            out.append(0)
        elif k.kind is KernelKind.GEMM:
            out.append(1)
        else:
            out.append(out[-1] if out else 0)
    return tuple(out)


def layer_split(graph: KernelGraph, devices: int = 2) -> tuple[int, ...]:
    """Contiguous layer ranges of (near) equal kernel counts; prologue with the first, epilogue the last."""
    per_layer = graph.by_layer()
    layers = sorted(x for x in per_layer if x is not None)
    total = sum(len(per_layer[x]) for x in layers) or 1
    owner: dict[int, int] = {}
    seen = 0
    for x in layers:
        owner[x] = min(devices - 1, (seen + len(per_layer[x]) // 2) * devices // total)
        seen += len(per_layer[x])
    out: list[int] = []
    for k in graph.kernels:
        if k.layer is not None:
            out.append(owner[k.layer])
        else:
            out.append(out[-1] if out else 0)  # prologue -> first owner (0); epilogue follows the last layer
    return tuple(out)


def interleave(graph: KernelGraph, devices: int = 2) -> tuple[int, ...]:
    """Layer l on device l mod D (prologue on 0, epilogue with the last layer): a transfer per layer."""
    out: list[int] = []
    for k in graph.kernels:
        out.append(k.layer % devices if k.layer is not None else (out[-1] if out else 0))
    return tuple(out)


def all_on(graph: KernelGraph, device: int = 0) -> tuple[int, ...]:
    return tuple(device for _ in graph.kernels)


PLACEMENTS = {"attention_gemm": attention_gemm, "layer_split": layer_split, "interleave": interleave}
MILP = "plan"

# Two local processes over gloo, as measured on a 2-core development machine: 65-130 µs for 4 KB, 3-5 GB/s for
# 8 MB. Only steers the MILP's cut; predictions use the link each run measures.
GLOO_LOCAL = LinkSpec(name="gloo-local", bytes_per_s=3e9, latency_s=1e-4,
                      source="measured: gloo between two local processes on a 2-core machine")


def milp(graphs: dict[str, KernelGraph], devices: int, *, microbatches: int = 2, link: LinkSpec = GLOO_LOCAL,
         cost: CostModel | None = None) -> dict[str, tuple[int, ...]]:
    """The MILP's throughput-mode placement of each phase's graph over ``devices`` CPUs (catalog entry "cpu",
    kernel times from tessera.cost's CPU profile). The KV-owning phase
    (decode) first, then the others with its placement as background facts (weights already resident, KV
    home); any KV placed elsewhere is handed over by the runtime (runner.build_partitions)."""
    from tessera.cost.calibrate import default_cost_model
    from tessera.hardware import gpu
    from tessera.plan import Pool, prepare, solve_phase

    pool = Pool(gpus=tuple(gpu("cpu") for _ in range(devices)), link=link)
    cost = cost or default_cost_model()
    out = {}
    pre: dict[str, frozenset[int]] = {}
    kv_home: dict[str, int] = {}
    for phase in sorted(graphs, key=lambda p: p != Phase.DECODE):
        g = graphs[phase]
        prob = prepare(g, pool, cost, m=microbatches, kv_home=kv_home or None, preresident=pre)
        sol = solve_phase(prob, mode=Objective.THROUGHPUT, m=microbatches)
        if sol.assignment is None:
            raise UserError(f"the MILP found no placement of {g.model} {phase} on {devices} cpu devices "
                            f"({sol.status})")
        out[phase] = _align(tuple(sol.assignment), g, pre, devices)
        for k in g.kernels:
            for b in (*k.reads, *k.writes):
                buf, d = g.buffers[b], out[phase][k.id]
                if buf.role in (Role.WEIGHT, Role.KV, Role.STATE):
                    pre[buf.name] = pre.get(buf.name, frozenset()) | {d}
                if buf.role in (Role.KV, Role.STATE):
                    kv_home.setdefault(buf.name, d)
    return {p: out[p] for p in graphs}


def _align(assignment: tuple[int, ...], g: KernelGraph, pre: dict[str, frozenset[int]], devices: int
           ) -> tuple[int, ...]:
    """Relabel identical devices so this phase reuses the weights earlier phases placed: the solver sees
    every device permutation as equally good and may mirror the previous phase's split."""
    if not pre or devices > 5:
        return assignment
    touch: dict[int, set[int]] = {}  # weight buffer -> devices this phase puts it on
    for k in g.kernels:
        for b in (*k.reads, *k.writes):
            if g.buffers[b].role is Role.WEIGHT:
                touch.setdefault(b, set()).add(assignment[k.id])

    def reused(perm: tuple[int, ...]) -> int:
        return sum(g.buffers[b].bytes for b, ds in touch.items() for d in ds
                   if perm[d] in pre.get(g.buffers[b].name, frozenset()))

    best = max(itertools.permutations(range(devices)), key=reused)
    return tuple(best[d] for d in assignment)


def carry_over(plan_graph: KernelGraph, assignment: tuple[int, ...], graph: KernelGraph) -> tuple[int, ...]:
    """A plan's assignment of ``plan_graph`` carried onto ``graph``, the same step captured another way (the
    planner's bf16 fake capture adds dtype casts the runtime's fp32 program lacks), by aligning the kernel
    name sequences; a kernel without a counterpart runs where the kernel before it runs."""
    names = [k.name for k in graph.kernels]
    match = difflib.SequenceMatcher(None, [k.name for k in plan_graph.kernels], names, autojunk=False)
    got: list[int | None] = [None] * len(names)
    for tag, i1, i2, j1, j2 in match.get_opcodes():
        if tag in ("equal", "replace"):
            for j in range(j1, min(j2, j1 + i2 - i1)):
                got[j] = assignment[i1 + j - j1]
    first = next((d for d in got if d is not None), 0)
    out: list[int] = []
    for d in got:
        out.append(d if d is not None else (out[-1] if out else first))
    return tuple(out)


def placements(name: str, graphs: dict[str, KernelGraph], devices: int, microbatches: int = 2
               ) -> dict[str, tuple[int, ...]]:
    """phase -> assignment of the eager ops for a placement named on the command line, made on ``graphs``
    (a fused view's placement runs each fused kernel's ops on its device)."""
    from tessera.capture.fuse import unfuse  # the capture stage imports torch: not at CLI start-up

    if name == MILP:
        got = milp(graphs, devices, microbatches=microbatches)
    elif name in PLACEMENTS:
        got = {ph: PLACEMENTS[name](g, devices) for ph, g in graphs.items()}
    else:
        raise choices_error("placement", name, [*PLACEMENTS, MILP])
    return {ph: unfuse(graphs[ph], a) for ph, a in got.items()}


def plan_placements(plan: Plan, programs: Mapping[str, CapturedProgram]) -> dict[str, tuple[int, ...]]:
    """phase -> assignment for running a Plan file's placement on ``programs`` (step key, e.g. decode@8 ->
    the runtime's program). The plan's graphs were captured by the planner (bf16, fake, fused view): where
    a phase's kernels differ from the program's fused view, the plan's assignment is carried over kernel by
    kernel and each fused kernel's ops run on its device. A serving-model plan's mixed iteration aligns
    with every step. Phases no program runs keep the plan's assignment."""
    from tessera.capture import capture_model  # the capture stage imports torch: not at CLI start-up
    from tessera.capture.fuse import unfuse

    by_phase = {ph: tuple(p.assignment) for ph, p in plan.phases.items()}
    mixed = (plan_graph(plan), tuple(plan.phases[Phase.MIXED].assignment)) if Phase.MIXED in plan.phases \
        else None
    for key, prog in programs.items():
        ph = key.split("@")[0]
        if mixed is not None:
            g = prog.placement_graph
            by_phase[ph] = unfuse(g, carry_over(mixed[0], mixed[1], g))
            continue
        pp = plan.phases.get(ph)
        if pp is not None and len(by_phase[ph]) != len(prog.ops):
            shape = {k: v for k, v in pp.graph_shape.items() if k in ("batch", "seq", "context") and v}
            g = prog.placement_graph
            by_phase[ph] = unfuse(g, carry_over(capture_model(plan.model, ph, **shape), tuple(pp.assignment), g))
    return by_phase
