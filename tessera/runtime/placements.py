"""Placements over two or more devices, for tests, benchmarks and `tessera run MODEL`: the hand-made splits
the issue compares (attention-type kernels on one device and GEMMs on the other, a contiguous layer split)
and the MILP's plan of the very graphs the runtime captured (tessera.plan's solver, CPU cost profile).
"""

from __future__ import annotations

from tessera.cost import CostModel
from tessera.errors import UserError, choices_error
from tessera.graph import KernelGraph, KernelKind, Role
from tessera.hardware import LinkSpec

ATTENTION_KINDS = frozenset({KernelKind.ATTENTION, KernelKind.ATTENTION_DECODE, KernelKind.SCAN, KernelKind.CONV})


def attention_gemm(graph: KernelGraph, devices: int = 2) -> tuple[int, ...]:
    """Attention-type kernels (and the ones touching KV/state) on device 0, GEMMs on device 1; any
    other kernel follows the kernel before it, so elementwise chains stay with their producer."""
    assert devices >= 2, "attention/GEMM split needs two devices"
    state = {b.id for b in graph.buffers if b.role in (Role.KV, Role.STATE)}
    out: list[int] = []
    for k in graph.kernels:
        if k.kind in ATTENTION_KINDS or state & {*k.reads, *k.writes}:
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

# Two local processes over gloo, as DESIGN.md's field notes measured here: 65-130 µs for 4 KB, 3-5 GB/s for
# 8 MB. Only steers the MILP's cut; predictions use the link each run measures.
GLOO_LOCAL = LinkSpec(name="gloo-local", bytes_per_s=3e9, latency_s=1e-4,
                      source="DESIGN.md field notes: gloo between two local processes on this machine")


def milp(graphs: dict[str, KernelGraph], devices: int, *, microbatches: int = 2, link: LinkSpec = GLOO_LOCAL,
         cost: CostModel | None = None) -> dict[str, tuple[int, ...]]:
    """The MILP's throughput-mode placement of each phase's graph over ``devices`` CPUs (catalog entry "cpu",
    kernel times from tessera.cost's CPU profile). Phases are solved independently; the runtime hands KV and
    state over between them (runner.build_partitions)."""
    from tessera.cost.calibrate import default_cost_model
    from tessera.hardware import gpu
    from tessera.plan.pool import Pool
    from tessera.plan.solve import prepare, solve_phase

    pool = Pool(gpus=tuple(gpu("cpu") for _ in range(devices)), link=link)
    cost = cost or default_cost_model()
    out = {}
    for phase, g in graphs.items():
        sol = solve_phase(prepare(g, pool, cost, m=microbatches), mode="throughput", m=microbatches)
        if sol.assignment is None:
            raise UserError(f"the MILP found no placement of {g.model} {phase} on {devices} cpu devices "
                            f"({sol.status})")
        out[phase] = tuple(sol.assignment)
    return out


def placements(name: str, graphs: dict[str, KernelGraph], devices: int, microbatches: int = 2
               ) -> dict[str, tuple[int, ...]]:
    """phase -> assignment for a placement named on the command line."""
    if name == MILP:
        return milp(graphs, devices, microbatches=microbatches)
    if name not in PLACEMENTS:
        raise choices_error("placement", name, [*PLACEMENTS, MILP])
    return {ph: PLACEMENTS[name](g, devices) for ph, g in graphs.items()}
