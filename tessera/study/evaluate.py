"""`tessera evaluate`: the evaluation study — model families × workload shapes × GPU pools of 2 to 16 GPUs.

Per cell (model, shape, pool, link): ``plan_serving`` gives Tessera and every baseline at its best batch and
micro-batch count under the study's planner config (``study_config``); pools of more than two GPUs are
also planned as a fleet (``plan_fleet``: cells of up to 8 GPUs, replicated), and Tessera's answer is the
better of the two. Beside each cell: the best homogeneous deployment of the same number of GPUs (each type
of the pool, H100 and H200) for tokens per dollar, and every strategy's goodput beside the simulator's SLO
knee of the same deployment (planner–simulator agreement, tessera.study.agreement). Cells are appended to a JSON-lines file as they finish, so an
interrupted run is usable and resumes where it stopped. The summary (gains, headline checks, price and
link sensitivity) is computed from the cells alone (``tessera.report.evalsummary``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tessera.contracts.plan import PoolPlan
from tessera.contracts.study import (
    CellPlacement,
    DevicePlacement,
    EvalCell,
    EvalStudy,
    FleetAnswer,
    KneeCheck,
    SameSize,
    StrategyEntry,
    StudyShape,
    StudySummary,
    TesseraAnswer,
)
from tessera.errors import UserError
from tessera.fleet.fleet import plan_fleet
from tessera.fleet.spec import FleetSpec
from tessera.hardware import AUTO, IN_SERVER, best_link, buildable, cell_link
from tessera.hardware import gpu as catalog_gpu
from tessera.plan import (
    STRATEGIES,
    PlannerConfig,
    Shapes,
    Traffic,
    capture_source,
    default_cost,
    engine_gpu,
    homogeneous,
    plan_serving,
    resolve_gpu,
)
from tessera.report.data import placement_map_path
from tessera.report.evalsummary import answer, became, best_baseline, extremes, markdown, summary
from tessera.report.placement import plot_placement_map
from tessera.study.agreement import knee_check
from tessera.study.compare import placement_summary
from tessera.study.workloads import Shape, shapes

FAMILIES = {"llama-3-8b": "dense LLM", "mixtral-8x7b": "MoE LLM", "mamba2-2.7b": "state-space LLM",
            "qwen2.5-vl-7b": "vision-language", "flux-dev": "diffusion transformer"}
TEXT = ("conversation", "code", "summarise", "reason")
MODEL_SHAPES = {"llama-3-8b": TEXT, "mixtral-8x7b": TEXT, "mamba2-2.7b": TEXT,
                "qwen2.5-vl-7b": ("caption", *TEXT), "flux-dev": ("image-1024",)}
REFERENCES = ("H100-SXM", "H200")
RUN_ORDER = ("llama-3-8b", "mamba2-2.7b", "qwen2.5-vl-7b", "mixtral-8x7b")  # cheapest first  # the high-end GPUs the paper's headline compares a pair against


@dataclass(frozen=True, kw_only=True)
class StudyPool:
    """A pool: GPU type (catalog name) -> count, in order."""

    name: str
    gpus: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not self.gpus or any(n < 1 for _, n in self.gpus):
            raise UserError(f"pool {self.name!r}: counts {self.gpus} must be positive")

    @property
    def names(self) -> list[str]:
        return [g for g, n in self.gpus for _ in range(n)]

    @property
    def size(self) -> int:
        return sum(n for _, n in self.gpus)

    @property
    def heterogeneous(self) -> bool:
        return len(self.gpus) > 1

    @property
    def specs(self) -> tuple:
        return tuple(catalog_gpu(n) for n in self.names)


def sensitivity_links(pool: StudyPool) -> tuple[str, ...]:
    """The links a pair is also run at beside its best: the next slower in-server link it can have (PCIe of
    a lower generation, or PCIe under NVLink) and the slowest link it can have (two servers over a network);
    only links the pair can be built with."""
    best = best_link(pool.specs)
    links = [lk for lk in buildable(pool.specs) if lk.name != best.name]
    slower = [lk for lk in links
              if lk.kind in IN_SERVER and lk.effective_bytes_per_s < best.effective_bytes_per_s]
    return tuple(dict.fromkeys(lk.name for lk in (*slower[:1], *links[-1:])))


def _pool(*gpus: tuple[str, int]) -> StudyPool:
    name = "+".join(f"{n}x{g}" if n > 1 else g for g, n in gpus)
    return StudyPool(name=name, gpus=tuple(gpus))


H100, H20, L40S, A100, L4, H200 = "H100-SXM", "H20", "L40S", "A100-80GB-SXM", "L4", "H200"
# Core pools first (the matrix the issue asks for), then the 4-GPU and five-type 16-GPU pools.
POOLS = (_pool((H100, 1), (L40S, 1)), _pool((H100, 1), (H20, 1)), _pool((A100, 1), (L40S, 1)), _pool((H100, 2)),
         _pool((H100, 4), (H20, 4)), _pool((H100, 8), (L40S, 8)),
         _pool((H100, 2), (L40S, 2)), _pool((H100, 4), (A100, 4), (H20, 4), (L40S, 2), (L4, 2)))
CORE_POOLS = 6
BASE_LINK = AUTO  # each pool's best link (tessera.hardware.links); the pairs also at sensitivity_links
QUICK = (("llama-3-8b", "conversation", 0), ("llama-3-8b", "code", 0), ("llama-3-8b", "summarise", 0),
         ("llama-3-8b", "reason", 0), ("llama-3-8b", "conversation", 3), ("mamba2-2.7b", "code", 0),
         ("qwen2.5-vl-7b", "caption", 1), ("flux-dev", "image-1024", 0))


def study_config(s: Shape, link: str = BASE_LINK):
    """plan_serving's config for one shape: default SLO; micro-batch counts 1, 2, 4 and ≤ 3 s, 2% gap per
    MILP solve (a pair plans in seconds instead of half a minute); the same for every strategy."""
    t = Traffic(prompt=s.prompt, output=s.output, steps=s.steps, image_tokens=s.image_tokens)
    return PlannerConfig(traffic=t, link=link, microbatches=(1, 2, 4), time_limit_s=3.0, mip_rel_gap=0.02)


@dataclass(frozen=True, kw_only=True)
class CellKey:
    model: str
    shape: str
    pool: str
    link: str

    def text(self) -> str:
        return f"{self.model} | {self.shape} | {self.pool} | {self.link}"


def matrix(quick: bool = False) -> list[tuple[str, str, StudyPool, str]]:
    """(model, shape, pool, link) in run order, most needed first so that a partial run stays usable:
    every model-shape on the core pairs (breadth first: every family and shape), then on the core pools
    of 8 and 16 GPUs, the first heterogeneous pair at the other links for each model's first shape, the
    extra pools (16 GPUs of five types, 4 GPUs), then the other pairs at the other links."""
    if quick:
        return [(m, s, POOLS[i], BASE_LINK) for m, s, i in QUICK]
    order = [(m, s) for m in RUN_ORDER[:2] for s in MODEL_SHAPES[m]]
    order += [("qwen2.5-vl-7b", "caption"), ("flux-dev", "image-1024")]
    order += [(m, s) for m in RUN_ORDER[2:] for s in MODEL_SHAPES[m] if (m, s) not in order]
    core = POOLS[:CORE_POOLS]
    out = [(m, s, p, BASE_LINK) for size2 in (True, False) for m, s in order for p in core if (p.size == 2) == size2]
    pairs = [p for p in POOLS if p.size == 2 and p.heterogeneous]
    firsts = [(m, ss[0]) for m, ss in MODEL_SHAPES.items()]
    out += [(m, s, pairs[0], lk) for lk in sensitivity_links(pairs[0]) for m, s in firsts]
    out += [(m, s, p, BASE_LINK) for p in reversed(POOLS[CORE_POOLS:]) for m, s in order]
    out += [(m, s, p, lk) for p in pairs[1:] for lk in sensitivity_links(p) for m, s in firsts]
    return out


# ---- one cell ---------------------------------------------------------------------------------------------------


def _strategy(s, knee: bool) -> StrategyEntry:
    return StrategyEntry(goodput_per_s=s.goodput, usd_per_hour=s.usd_per_hour, applicable=s.applicable,
                         feasible=s.feasible, reason=None if s.feasible else s.reason, tp=tuple(s.tp),
                         batch=s.plan.batch if s.plan else None,
                         microbatches=s.plan.microbatches if s.plan else None,
                         knee=knee_check(s.deployment, s.goodput) if knee and s.feasible else None)


def homogeneous_of(model: str, s: Shape, gpu: str, n: int, cache: dict) -> SameSize:
    """n GPUs of one type as vLLM deploys them (best TP × replicas), at list price; cached per process."""
    key = (model, s.name, gpu, n)
    if key not in cache:
        cfg = study_config(s)
        shp = Shapes(model, capture_source(model), cfg, images=s.images)
        spec = engine_gpu(resolve_gpu(gpu), cfg.gpu_memory_utilization)
        r = homogeneous(shp, (spec,) * n, best_link((spec,) * n), default_cost(), cfg)  # n GPUs as they come
        cache[key] = SameSize(gpu=spec.name, count=n, goodput_per_s=r.goodput, tp=tuple(r.tp),
                              usd_per_hour=spec.usd_per_hour * n)
    return cache[key]


def fleet_answer(model: str, pool: StudyPool, cfg) -> tuple[FleetAnswer, PoolPlan | None]:
    """The pool planned as replicated cells of up to 8 GPUs (tessera.fleet): its summary, and its cells'
    plans with their counts (None if nothing serves)."""
    try:
        f = plan_fleet(model, FleetSpec(gpus=pool.gpus, link=cfg.link), cfg, budget_s=20.0, max_gpus=8)
    except UserError as e:
        return FleetAnswer(goodput_per_s=0.0, reason=str(e).splitlines()[0]), None
    used: dict[str, int] = {}
    for c in f.cells:
        for g in c.gpus:
            used[g] = used.get(g, 0) + c.count
    desc = ", ".join(f"{c.count}x({'+'.join(c.gpus)}{' = ' + c.chosen if c.chosen != 'milp' else ''})"
                     for c in f.cells)
    return (FleetAnswer(goodput_per_s=f.goodput_per_s, usd_per_hour=f.usd_per_hour, used=used, cells=desc,
                        gap=f.gap, milp_cells=sum(1 for c in f.cells if c.chosen == "milp")), f.plans)


def sim_of_answer(ans: TesseraAnswer, strategies: dict[str, StrategyEntry], t,
                  fleet_pool: PoolPlan | None) -> KneeCheck | None:
    """The planner-vs-simulator check of the cell's Tessera answer: the simulator's SLO knee of its
    deployment (one cell's Plan, a prefill/decode pair, or a pool of cells) beside the planner's goodput.
    None when nothing serves, or for a replicated pair, whose check is its pair cell's (evalsummary.sim_of)."""
    if ans.goodput_per_s <= 0:
        return None
    if ans.source == "cell":
        mine = strategies.get(t.chosen) if t.chosen != "milp" else None
        return (mine.knee if mine is not None else None) or knee_check(t.deployment, t.goodput)
    return knee_check(fleet_pool, ans.goodput_per_s) if fleet_pool is not None else None


def replicated_pair(pool: StudyPool, pair: EvalCell) -> FleetAnswer:
    """k copies of the pair cell's Tessera answer on a pool of k GPUs of each of the pair's two types (the
    replicated cell plan_fleet would weigh, planned once under the study's own config)."""
    k = pool.gpus[0][1]
    t = answer(pair)
    how = became(pair)
    base_name, base = best_baseline(pair)
    return FleetAnswer(baseline=f"{k}x({pair.pool} = {base_name})", baseline_goodput_per_s=k * base,
                       goodput_per_s=k * t.goodput_per_s, usd_per_hour=k * t.usd_per_hour,
                       used={g: k * n for g, n in t.used.items()}, cells=f"{k}x({pair.pool} = {how})",
                       gap=None, milp_cells=1 if t.chosen == "milp" and how == "milp" else 0, replicated=True)


def pair_of(pool: StudyPool, model: str, shape: str, link: str, cells: list[EvalCell]) -> EvalCell | None:
    """The finished pair cell a two-type pool of k + k GPUs replicates, if there is one."""
    if len(pool.gpus) != 2 or pool.gpus[0][1] != pool.gpus[1][1] or pool.size <= 2:
        return None
    want = tuple((g, 1) for g, _ in pool.gpus)
    return next((c for c in cells if c.model == model and c.shape == shape and c.link == link
                 and c.gpus == want and c.error is None), None)


def run_cell(model: str, s: Shape, pool: StudyPool, link: str, cache: dict, *, simulate_plan: bool = True,
             pair_cell: EvalCell | None = None, progress: Callable[[str], None] | None = None) -> EvalCell:
    """One cell. ``pair_cell``: for a pool of k GPUs of each of two types, the finished cell of their pair
    (same model, shape, link), whose Tessera answer replicated k times stands for the fleet search."""
    t0 = time.perf_counter()
    cfg = study_config(s, link)
    prices = {g: catalog_gpu(g).usd_per_hour for g, _ in pool.gpus}
    cell = EvalCell(model=model, family=FAMILIES[model], shape=s.name, prompt=s.prompt, output=s.output,
                    steps=s.steps, images=s.images, pool=pool.name, gpus=pool.gpus, n_gpus=pool.size, link=link,
                    link_used=cell_link(pool.specs, link).name, prices=prices)
    try:
        r = plan_serving(model, pool.names, cfg, progress=progress)
    except UserError as e:
        return replace(cell, error=str(e).splitlines()[0], wall_s=time.perf_counter() - t0,
                       load_1min=os.getloadavg()[0])
    strategies = {n: _strategy(r.strategies[n], simulate_plan and n != "tessera") for n in STRATEGIES}
    t = r.tessera
    ans = TesseraAnswer(goodput_per_s=t.goodput, usd_per_hour=t.usd_per_hour, chosen=t.chosen, source="cell",
                        used={g: n for g, n in pool.gpus})
    fleet, fleet_pool = None, None
    if pool.size > 2:
        fleet, fleet_pool = (replicated_pair(pool, pair_cell), None) if pair_cell is not None else \
            fleet_answer(model, pool, cfg)
        if fleet.goodput_per_s > t.goodput * (1 + 1e-9):
            ans = TesseraAnswer(goodput_per_s=fleet.goodput_per_s, usd_per_hour=fleet.usd_per_hour,
                                chosen=f"fleet: {fleet.cells}", source="fleet", used=dict(fleet.used or {}))
    same_size = tuple(homogeneous_of(model, s, g, pool.size, cache)
                      for g in dict.fromkeys([*(g for g, _ in pool.gpus), *REFERENCES]))
    prices = {**prices, **{g: catalog_gpu(g).usd_per_hour for g in REFERENCES}}  # the references' too
    placement = None
    if ans.source == "cell" and t.plan is not None and t.point is not None and t.pool is None:
        placement = CellPlacement(batch=t.point.batch, microbatches=t.point.microbatches,
                                  devices=tuple(d.gpu for d in t.plan.devices), assignment=tuple(t.point.assignment),
                                  summary=_placement_summary(r))
    sim = None
    if simulate_plan:
        sim = sim_of_answer(ans, strategies, t, fleet_pool)
        strategies["tessera"] = replace(strategies["tessera"], knee=sim if ans.source == "cell" else None)
    return replace(cell, prices=prices, strategies=strategies, tessera=ans, fleet=fleet, same_size=same_size, placement=placement,
                   simulated=simulate_plan, sim=sim, wall_s=time.perf_counter() - t0, solve_s=r.solve_s,
                   load_1min=os.getloadavg()[0])


def _placement_summary(r) -> dict[str, DevicePlacement]:
    try:
        return {dev: DevicePlacement.from_dict(p) for dev, p in placement_summary(r).items()}
    except UserError:  # a TP-group device name is not a catalog name: no per-kind times
        return {}


# ---- the run ----------------------------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_cells(path: Path) -> list[EvalCell]:
    """The cells a previous (maybe interrupted) run appended; a torn last line is dropped."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(EvalCell.from_dict(json.loads(line)))
        except json.JSONDecodeError:
            continue
    return out


def key_of(c: EvalCell) -> CellKey:
    return CellKey(model=c.model, shape=c.shape, pool=c.pool, link=c.link)


@dataclass(frozen=True, kw_only=True)
class Shard:
    """Which of the cells still to run this process takes: every ``count``-th from ``index`` (0-based),
    so ``count`` processes resume one matrix side by side, each appending whole lines to one file."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise UserError(f"--shard {self.index + 1}/{self.count}: K must be 1..N, N >= 1 (e.g. 1/2 and 2/2)")

    @classmethod
    def parse(cls, text: str) -> Shard:
        k, _, n = text.partition("/")
        if not (k.isdigit() and n.isdigit()):
            raise UserError(f"--shard {text!r}: expected K/N, e.g. 1/2 and 2/2 for two processes")
        return cls(index=int(k) - 1, count=int(n))


def run_evaluate(*, out_dir: Path, quick: bool = False, fresh: bool = False, simulate_plans: bool = True,
                 limit: int | None = None, shard: Shard = Shard()) -> EvalStudy:
    """Run (or resume) the matrix, appending each cell to eval[.quick].cells.jsonl; then write
    eval[.quick].json and .md from every cell there. Returns the JSON written. ``shard``: this process's
    share of the cells still to run (``fresh`` is refused with more than one shard: one would delete
    what the others wrote)."""
    if fresh and shard.count > 1:
        raise UserError("--fresh with --shard: start the shards without --fresh after one --fresh --limit 0")
    stem = "eval.quick" if quick else "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = out_dir / f"{stem}.cells.jsonl"
    if fresh and lines.exists():
        lines.unlink()
    done = {key_of(c) for c in load_cells(lines)}
    todo = [x for x in matrix(quick) if CellKey(model=x[0], shape=x[1], pool=x[2].name, link=x[3]) not in done]
    todo = todo[shard.index::shard.count]
    if limit is not None:
        todo = todo[:limit]
    all_shapes = shapes()
    cache: dict = {}
    finished = load_cells(lines)
    t0 = time.perf_counter()
    _log(f"evaluate: {len(done)} cells done before, {len(todo)} to run")
    for i, (m, sname, pool, link) in enumerate(todo):
        _log(f"[{time.perf_counter() - t0:6.0f} s] {i + 1}/{len(todo)} {m} | {sname} | {pool.name} | {link} "
             f"(load {os.getloadavg()[0]:.1f})")
        c = run_cell(m, all_shapes[sname], pool, link, cache, simulate_plan=simulate_plans,
                     pair_cell=pair_of(pool, m, sname, link, finished))
        finished.append(c)
        with lines.open("a") as f:  # one write per line: shards side by side append whole lines
            f.write(json.dumps(c.to_dict()) + "\n")
        _log(f"    {c.error or answer(c).chosen}: {c.wall_s:.1f} s")
    cells = load_cells(lines)
    run_s = time.perf_counter() - t0
    data = EvalStudy(cells=tuple(cells), summary=summary(cells), run_wall_s=run_s,
                     cells_wall_s=sum(c.wall_s for c in cells), complete=len(cells) >= len(matrix(quick)),
                     planned_cells=len(matrix(quick)), load_1min=os.getloadavg()[0],
                     shapes={n: StudyShape(prompt=s.prompt, output=s.output, steps=s.steps,
                                           image_tokens=s.image_tokens, source=s.source)
                             for n, s in all_shapes.items()})
    (out_dir / f"{stem}.json").write_text(json.dumps(data.to_dict(), indent=1))
    (out_dir / f"{stem}.md").write_text(markdown(data, stem))
    return data


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What `tessera evaluate` shows: the study's summary (eval[.quick].json's ``summary``), its markdown
    (eval[.quick].md) and the placement maps drawn (label, PNG path)."""

    summary: StudySummary
    markdown: str
    maps: tuple[tuple[str, Path], ...]


def evaluate_study(*, out_dir: Path, quick: bool = False, fresh: bool = False, simulate_plans: bool = True,
                   limit: int | None = None, shard: Shard = Shard()) -> Evaluation:
    """``run_evaluate``, then the placement maps of its best and worst cells beside the files."""
    data = run_evaluate(out_dir=out_dir, quick=quick, fresh=fresh, simulate_plans=simulate_plans, limit=limit,
                        shard=shard)
    stem = "eval.quick" if quick else "eval"
    maps = placement_maps(data, out_dir, stem)
    return Evaluation(summary=data.summary, markdown=markdown(data, stem), maps=tuple(maps))


def placement_maps(data: EvalStudy, fig_dir: Path, stem: str = "eval") -> list[tuple[str, Path]]:
    """PNG placement maps of the best and worst cells (by goodput gain) that have a single-cell placement."""
    fig_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for label, c in extremes(list(data.cells)):
        p = c.placement
        assert p is not None  # extremes are cells with a single-cell placement
        s = replace(shapes()[c.shape])
        shp = Shapes(c.model, capture_source(c.model), study_config(s, c.link), images=s.images)
        g = shp.graph(p.batch, p.microbatches)
        path = placement_map_path(fig_dir, stem, label)
        title = (f"{label} cell: {c.model}, {c.shape}, {c.pool} ({answer(c).chosen}, "
                 f"batch {p.batch}, m={p.microbatches})")
        plot_placement_map(g, list(p.assignment), [f"{i}:{d}" for i, d in enumerate(p.devices)], path, title=title)
        out.append((label, path))
    return out
