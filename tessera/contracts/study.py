"""The study → report boundary: what `tessera evaluate` writes (eval.cells.jsonl, eval.json), the rows of
`tessera compare`'s compare.json, and the planner-vs-simulator checks both run. One serializer each
(``to_dict``/``from_dict``), whose key order and omitted keys are those of the files.

Goodputs are output tokens/s (images/s for a diffusion model); prices are US dollars per hour."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera.contracts.provenance import Provenance

Json = dict[str, Any]


def _opt(cls: Any, d: Json | None) -> Any:
    return None if d is None else cls.from_dict(d)


# ---- the planner-vs-simulator check -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class KneeCheck:
    """The simulator's SLO knee of a strategy's deployment beside the planner's goodput; ``error`` (and no
    knee) where it could not be simulated; ``from_pair``: a replicated pair carries its pair cell's check."""

    planner_per_s: float
    knee_per_s: float | None = None
    ratio: float | None = None  # knee / planner
    attainment: float | None = None  # share of requests meeting the SLO at the knee
    rates: int | None = None  # rates simulated by the bisection
    requests: int | None = None  # requests per simulated rate
    wall_s: float | None = None
    note: str | None = None
    error: str | None = None
    from_pair: str | None = None

    def to_dict(self) -> Json:
        if self.error is not None:
            out: Json = {"planner_per_s": self.planner_per_s, "error": self.error}
        else:
            out = {"planner_per_s": self.planner_per_s, "knee_per_s": self.knee_per_s, "ratio": self.ratio,
                   "attainment": self.attainment, "rates": self.rates, "requests": self.requests,
                   "wall_s": self.wall_s, "note": self.note}
        return out | ({"from_pair": self.from_pair} if self.from_pair is not None else {})

    @classmethod
    def from_dict(cls, d: Json) -> KneeCheck:
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class CheckSummary:
    """How many checks agree within ``tolerance`` (|knee / planner − 1|) and the spread of knee / planner;
    ``checked`` 0 and nothing else when there was nothing to check."""

    checked: int
    within: int = 0
    tolerance: float = 0.0
    min: float = 0.0
    median: float = 0.0
    max: float = 0.0
    errors: int = 0

    def to_dict(self) -> Json:
        if not self.checked:
            return {"checked": 0}
        return {"checked": self.checked, "within": self.within, "tolerance": self.tolerance, "min": self.min,
                "median": self.median, "max": self.max, "errors": self.errors}

    @classmethod
    def from_dict(cls, d: Json) -> CheckSummary:
        return cls(**d)


# ---- one cell of the study (a line of eval.cells.jsonl) ----------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StrategyEntry:
    """One strategy on a cell's pool at its best batch and micro-batch count."""

    goodput_per_s: float
    usd_per_hour: float
    applicable: bool
    feasible: bool
    reason: str | None
    tp: tuple[int, ...]
    batch: int | None
    microbatches: int | None
    knee: KneeCheck | None

    def to_dict(self) -> Json:
        return {"goodput_per_s": self.goodput_per_s, "usd_per_hour": self.usd_per_hour,
                "applicable": self.applicable, "feasible": self.feasible, "reason": self.reason,
                "tp": list(self.tp), "batch": self.batch, "microbatches": self.microbatches,
                "knee": None if self.knee is None else self.knee.to_dict()}

    @classmethod
    def from_dict(cls, d: Json) -> StrategyEntry:
        return cls(**{**d, "tp": tuple(d["tp"]), "knee": _opt(KneeCheck, d["knee"])})


@dataclass(frozen=True, kw_only=True)
class TesseraAnswer:
    """Tessera's answer on the cell: one cell's plan ("cell") or the pool planned as a fleet ("fleet")."""

    goodput_per_s: float
    usd_per_hour: float
    chosen: str  # a strategy's name, or "fleet: <cells>"
    source: str  # "cell" or "fleet"
    used: dict[str, int]  # GPU type -> count used

    def to_dict(self) -> Json:
        return {"goodput_per_s": self.goodput_per_s, "usd_per_hour": self.usd_per_hour, "chosen": self.chosen,
                "source": self.source, "used": dict(self.used)}

    @classmethod
    def from_dict(cls, d: Json) -> TesseraAnswer:
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class FleetAnswer:
    """A pool of more than two GPUs planned as replicated cells: by the fleet search, or (``replicated``) as
    k copies of its pair cell beside k copies of the pair's best baseline; ``reason`` where nothing serves."""

    goodput_per_s: float
    usd_per_hour: float = 0.0
    used: dict[str, int] | None = None
    cells: str = ""  # "2x(H100-SXM+L40S = prefill_decode), ..."
    gap: float | None = None
    milp_cells: int = 0
    reason: str | None = None
    baseline: str | None = None
    baseline_goodput_per_s: float = 0.0
    replicated: bool = False

    def to_dict(self) -> Json:
        if self.reason is not None:
            return {"goodput_per_s": self.goodput_per_s, "reason": self.reason}
        head = {"baseline": self.baseline, "baseline_goodput_per_s": self.baseline_goodput_per_s} \
            if self.replicated else {}
        return head | {"goodput_per_s": self.goodput_per_s, "usd_per_hour": self.usd_per_hour,
                       "used": dict(self.used or {}), "cells": self.cells, "gap": self.gap,
                       "milp_cells": self.milp_cells} | ({"replicated": True} if self.replicated else {})

    @classmethod
    def from_dict(cls, d: Json) -> FleetAnswer:
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class DevicePlacement:
    """Which kernels a plan put on one device: their count and each kind's share of the device's time."""

    kernels: int
    share_by_kind: dict[str, float]

    def to_dict(self) -> Json:
        return {"kernels": self.kernels, "share_by_kind": dict(self.share_by_kind)}

    @classmethod
    def from_dict(cls, d: Json) -> DevicePlacement:
        return cls(**d)


def _placements_to_dict(by_device: dict[str, DevicePlacement]) -> Json:
    return {dev: p.to_dict() for dev, p in by_device.items()}


def _placements_from_dict(d: Json) -> dict[str, DevicePlacement]:
    """"0:H100-SXM" -> its placement; {} where the plan is not a MILP placement."""
    return {dev: DevicePlacement.from_dict(p) for dev, p in d.items()}


@dataclass(frozen=True, kw_only=True)
class CellPlacement:
    """A single-cell answer's placement: enough to redraw its placement map."""

    batch: int
    microbatches: int
    devices: tuple[str, ...]  # GPU names, in device order
    assignment: tuple[int, ...]  # kernel id -> device index
    summary: dict[str, DevicePlacement]

    def to_dict(self) -> Json:
        return {"batch": self.batch, "microbatches": self.microbatches, "devices": list(self.devices),
                "assignment": list(self.assignment), "summary": _placements_to_dict(self.summary)}

    @classmethod
    def from_dict(cls, d: Json) -> CellPlacement:
        return cls(batch=d["batch"], microbatches=d["microbatches"], devices=tuple(d["devices"]),
                   assignment=tuple(d["assignment"]), summary=_placements_from_dict(d["summary"]))


@dataclass(frozen=True, kw_only=True)
class SameSize:
    """As many GPUs of one type as the pool has, deployed as vLLM would (best TP × replicas), at list price."""

    gpu: str
    count: int
    goodput_per_s: float
    tp: tuple[int, ...]
    usd_per_hour: float

    def to_dict(self) -> Json:
        return {"gpu": self.gpu, "count": self.count, "goodput_per_s": self.goodput_per_s, "tp": list(self.tp),
                "usd_per_hour": self.usd_per_hour}

    @classmethod
    def from_dict(cls, d: Json) -> SameSize:
        return cls(**{**d, "tp": tuple(d["tp"])})


@dataclass(frozen=True, kw_only=True)
class EvalCell:
    """One cell of the study (model × shape × pool × link). A cell whose planning failed has ``error`` and
    no strategies, answer, same-size deployments or solve time; ``simulated``: the knee checks were run
    (``sim`` is then written, None where nothing serves or a replicated pair carries its pair's)."""

    model: str
    family: str
    shape: str
    prompt: int
    output: int
    steps: int
    images: bool
    pool: str
    gpus: tuple[tuple[str, int], ...]
    n_gpus: int
    link: str  # the link asked for ("auto": the best the pool can have)
    link_used: str
    prices: dict[str, float]  # GPU type -> list price, $/h
    strategies: dict[str, StrategyEntry] | None = None
    tessera: TesseraAnswer | None = None
    fleet: FleetAnswer | None = None
    same_size: tuple[SameSize, ...] = ()
    placement: CellPlacement | None = None
    simulated: bool = False
    sim: KneeCheck | None = None
    error: str | None = None
    wall_s: float = 0.0
    solve_s: float | None = None
    load_1min: float = 0.0

    def to_dict(self) -> Json:
        out: Json = {"model": self.model, "family": self.family, "shape": self.shape, "prompt": self.prompt,
                     "output": self.output, "steps": self.steps, "images": self.images, "pool": self.pool,
                     "gpus": [list(g) for g in self.gpus], "n_gpus": self.n_gpus, "link": self.link,
                     "link_used": self.link_used, "prices": dict(self.prices)}
        if self.error is not None:
            return out | {"error": self.error, "wall_s": self.wall_s, "load_1min": self.load_1min}
        assert self.strategies is not None and self.tessera is not None  # a planned cell has both
        out |= {"strategies": {n: s.to_dict() for n, s in self.strategies.items()},
                "tessera": self.tessera.to_dict()}
        if self.fleet is not None:
            out["fleet"] = self.fleet.to_dict()
        out["same_size"] = [h.to_dict() for h in self.same_size]
        if self.placement is not None:
            out["placement"] = self.placement.to_dict()
        if self.simulated:
            out["sim"] = None if self.sim is None else self.sim.to_dict()
        return out | {"wall_s": self.wall_s, "solve_s": self.solve_s, "load_1min": self.load_1min}

    @classmethod
    def from_dict(cls, d: Json) -> EvalCell:
        s = d.get("strategies")
        return cls(**{**d, "gpus": tuple((g, n) for g, n in d["gpus"]),
                      "strategies": None if s is None else {n: StrategyEntry.from_dict(x) for n, x in s.items()},
                      "tessera": _opt(TesseraAnswer, d.get("tessera")), "fleet": _opt(FleetAnswer, d.get("fleet")),
                      "same_size": tuple(SameSize.from_dict(h) for h in d.get("same_size", ())),
                      "placement": _opt(CellPlacement, d.get("placement")), "simulated": "sim" in d,
                      "sim": _opt(KneeCheck, d.get("sim"))})


# ---- the study's summary (eval.json's "summary") ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Stats:
    """best, median, worst of ``n`` ratios."""

    best: float
    median: float
    worst: float
    n: int

    def to_dict(self) -> Json:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Json) -> Stats:
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class GainSummary:
    """Tessera's goodput gain over the best baseline and tokens/$ gain over the best same-size homogeneous
    deployment, over the cells at their best link; the best cells named where there is a gain."""

    goodput: Stats | None
    per_usd: Stats | None
    only_tessera_serves: int
    kernel_level_wins: int
    cells: int
    chosen: dict[str, int]  # what Tessera became -> cells, most first
    goodput_best_cell: str | None = None
    per_usd_best_cell: str | None = None

    def to_dict(self) -> Json:
        out: Json = {"goodput": None if self.goodput is None else self.goodput.to_dict(),
                     "per_usd": None if self.per_usd is None else self.per_usd.to_dict(),
                     "only_tessera_serves": self.only_tessera_serves, "kernel_level_wins": self.kernel_level_wins,
                     "cells": self.cells, "chosen": dict(self.chosen)}
        if self.goodput_best_cell is not None:
            out["goodput_best_cell"] = self.goodput_best_cell
        if self.per_usd_best_cell is not None:
            out["per_usd_best_cell"] = self.per_usd_best_cell
        return out

    @classmethod
    def from_dict(cls, d: Json) -> GainSummary:
        return cls(**{**d, "goodput": _opt(Stats, d["goodput"]), "per_usd": _opt(Stats, d["per_usd"])})


@dataclass(frozen=True, kw_only=True)
class FamilyShapeAnswer:
    """Per (model, shape): kernel-level wins, the best of them (gain or None: only Tessera serves; pool), ties."""

    model: str
    family: str
    shape: str
    pools: int
    wins: int
    best_win: tuple[float | None, str] | None
    ties: dict[str, int]  # the baseline Tessera became -> cells
    gain: Stats | None

    def to_dict(self) -> Json:
        return {"model": self.model, "family": self.family, "shape": self.shape, "pools": self.pools,
                "wins": self.wins, "best_win": None if self.best_win is None else list(self.best_win),
                "ties": dict(self.ties), "gain": None if self.gain is None else self.gain.to_dict()}

    @classmethod
    def from_dict(cls, d: Json) -> FamilyShapeAnswer:
        bw = d["best_win"]
        return cls(**{**d, "best_win": None if bw is None else (bw[0], bw[1]), "gain": _opt(Stats, d["gain"])})


@dataclass(frozen=True, kw_only=True)
class HeadlineCheck:
    """Does a heterogeneous pair beat 2×reference in goodput, in tokens per $, both with one pair?"""

    model: str
    shape: str
    reference: str  # "2xH100-SXM"
    ref_goodput: float
    ref_per_usd: float
    fastest_pair: str
    fastest_goodput: float
    beats_throughput: bool
    cheapest_pair: str
    cheapest_per_usd: float
    beats_per_usd: bool
    both: bool

    def to_dict(self) -> Json:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Json) -> HeadlineCheck:
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class PriceScenario:
    """One price scenario: tokens/$ gains re-weighted, the cells and headline checks that still win."""

    scenario: str
    per_usd: Stats | None
    beats_same_size: int
    cells: int
    pair_beats_ref_per_usd: int
    pair_beats_ref_both: int
    checks: int

    def to_dict(self) -> Json:
        return dict(self.__dict__) | {"per_usd": None if self.per_usd is None else self.per_usd.to_dict()}

    @classmethod
    def from_dict(cls, d: Json) -> PriceScenario:
        return cls(**{**d, "per_usd": _opt(Stats, d["per_usd"])})


@dataclass(frozen=True, kw_only=True)
class LinkPoint:
    gain: float | None
    chosen: str
    goodput_per_s: float

    def to_dict(self) -> Json:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Json) -> LinkPoint:
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class LinkSensitivity:
    """One pair run at several links: Tessera's gain and choice at each ("pcie4 (best)", "eth100", ...)."""

    model: str
    shape: str
    pool: str
    links: dict[str, LinkPoint]

    def to_dict(self) -> Json:
        return {"model": self.model, "shape": self.shape, "pool": self.pool,
                "links": {k: v.to_dict() for k, v in self.links.items()}}

    @classmethod
    def from_dict(cls, d: Json) -> LinkSensitivity:
        return cls(**{**d, "links": {k: LinkPoint.from_dict(v) for k, v in d["links"].items()}})


@dataclass(frozen=True, kw_only=True)
class StudyAgreement:
    """The knee checks of every strategy and of Tessera's answers, and the answer that agrees worst."""

    strategies: CheckSummary
    answers: CheckSummary
    worst_cell: str | None
    worst_ratio: float | None
    not_simulated: int
    from_pair: int

    def to_dict(self) -> Json:
        return dict(self.__dict__) | {"strategies": self.strategies.to_dict(), "answers": self.answers.to_dict()}

    @classmethod
    def from_dict(cls, d: Json) -> StudyAgreement:
        return cls(**{**d, "strategies": CheckSummary.from_dict(d["strategies"]),
                      "answers": CheckSummary.from_dict(d["answers"])})


@dataclass(frozen=True, kw_only=True)
class Extreme:
    """The best or worst cell by goodput gain among those with a single-cell placement."""

    label: str  # "best" / "worst"
    cell: str
    gain: float | None
    chosen: str
    placement: dict[str, DevicePlacement]

    def to_dict(self) -> Json:
        return dict(self.__dict__) | {"placement": _placements_to_dict(self.placement)}

    @classmethod
    def from_dict(cls, d: Json) -> Extreme:
        return cls(**{**d, "placement": _placements_from_dict(d["placement"])})


@dataclass(frozen=True, kw_only=True)
class StudySummary:
    """The study's conclusions, computed from its cells alone; ``agreement`` None for a study written before
    the knee check (its figures are not the check)."""

    gains: GainSummary
    answers: tuple[FamilyShapeAnswer, ...]
    headline: tuple[HeadlineCheck, ...]
    price_sensitivity: tuple[PriceScenario, ...]
    link_sensitivity: tuple[LinkSensitivity, ...]
    agreement: StudyAgreement | None
    extremes: tuple[Extreme, ...]

    def to_dict(self) -> Json:
        return {"gains": self.gains.to_dict(), "answers": [a.to_dict() for a in self.answers],
                "headline": [h.to_dict() for h in self.headline],
                "price_sensitivity": [p.to_dict() for p in self.price_sensitivity],
                "link_sensitivity": [lk.to_dict() for lk in self.link_sensitivity],
                "agreement": {} if self.agreement is None else self.agreement.to_dict(),
                "extremes": [e.to_dict() for e in self.extremes]}

    @classmethod
    def from_dict(cls, d: Json) -> StudySummary:
        a = d["agreement"]
        return cls(gains=GainSummary.from_dict(d["gains"]),
                   answers=tuple(FamilyShapeAnswer.from_dict(x) for x in d["answers"]),
                   headline=tuple(HeadlineCheck.from_dict(x) for x in d["headline"]),
                   price_sensitivity=tuple(PriceScenario.from_dict(x) for x in d["price_sensitivity"]),
                   link_sensitivity=tuple(LinkSensitivity.from_dict(x) for x in d["link_sensitivity"]),
                   agreement=StudyAgreement.from_dict(a) if "strategies" in a else None,
                   extremes=tuple(Extreme.from_dict(x) for x in d["extremes"]))


@dataclass(frozen=True, kw_only=True)
class StudyShape:
    """A workload shape of the study: mean prompt (of which image tokens) and output tokens, diffusion steps."""

    prompt: int
    output: int
    steps: int
    image_tokens: int
    source: str

    def to_dict(self) -> Json:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Json) -> StudyShape:
        return cls(**{"image_tokens": 0, **d})


@dataclass(frozen=True, kw_only=True)
class EvalStudy:
    """eval[.quick].json: every cell, the summary computed from them, and how the run went."""

    cells: tuple[EvalCell, ...]
    summary: StudySummary
    run_wall_s: float = 0.0
    cells_wall_s: float = 0.0  # planning time summed over cells
    complete: bool = False
    planned_cells: int | None = None
    load_1min: float = 0.0
    shapes: dict[str, StudyShape]

    def to_dict(self) -> Json:
        return {"cells": [c.to_dict() for c in self.cells], "summary": self.summary.to_dict(),
                "run_wall_s": self.run_wall_s, "cells_wall_s": self.cells_wall_s, "complete": self.complete,
                "planned_cells": self.planned_cells, "load_1min": self.load_1min,
                "shapes": {n: s.to_dict() for n, s in self.shapes.items()}}

    @classmethod
    def from_dict(cls, d: Json) -> EvalStudy:
        return cls(**{**d, "cells": tuple(EvalCell.from_dict(c) for c in d["cells"]),
                      "summary": StudySummary.from_dict(d["summary"]),
                      "shapes": {n: StudyShape.from_dict(s) for n, s in d.get("shapes", {}).items()}})


# ---- `tessera compare`'s rows (compare.json's "cells") ------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CompareStrategy:
    """One strategy on a compare row's pool at its best batch and micro-batch count. Goodput and goodput per
    dollar are written under the row's unit: ``goodput_tokens_per_s``/``tokens_per_usd``, or (``images``)
    ``goodput_images_per_s``/``images_per_usd``. ``slo_binding``: the SLO bound ("TTFT", "TPOT", ...)."""

    images: bool
    goodput_per_s: float
    usd_per_hour: float
    per_usd: float
    applicable: bool
    feasible: bool
    reason: str | None
    batch: int | None
    microbatches: int | None
    max_num_batched_tokens: int | None
    slo_binding: str | None
    knee: KneeCheck | None

    def to_dict(self) -> Json:
        unit = "images" if self.images else "tokens"
        return {f"goodput_{unit}_per_s": self.goodput_per_s, "usd_per_hour": self.usd_per_hour,
                f"{unit}_per_usd": self.per_usd, "applicable": self.applicable, "feasible": self.feasible,
                "reason": self.reason, "batch": self.batch, "microbatches": self.microbatches,
                "max_num_batched_tokens": self.max_num_batched_tokens, "slo_binding": self.slo_binding,
                "knee": None if self.knee is None else self.knee.to_dict()}

    @classmethod
    def from_dict(cls, d: Json) -> CompareStrategy:
        images = "goodput_images_per_s" in d
        unit = "images" if images else "tokens"
        return cls(images=images, goodput_per_s=d[f"goodput_{unit}_per_s"], usd_per_hour=d["usd_per_hour"],
                   per_usd=d[f"{unit}_per_usd"], applicable=d["applicable"], feasible=d["feasible"],
                   reason=d["reason"], batch=d["batch"], microbatches=d["microbatches"],
                   max_num_batched_tokens=d["max_num_batched_tokens"], slo_binding=d["slo_binding"],
                   knee=_opt(KneeCheck, d["knee"]))


@dataclass(frozen=True, kw_only=True)
class SameBudget:
    """``len(gpus)`` GPUs of one type deployed as vLLM would (tensor parallel degree per replica in ``tp``):
    goodput (output tokens/s, images/s for a diffusion model), $/h and goodput per dollar."""

    gpus: tuple[str, ...]
    goodput: float
    usd_per_hour: float
    tokens_per_usd: float
    tp: tuple[int, ...]

    def to_dict(self) -> Json:
        return {"gpus": list(self.gpus), "goodput": self.goodput, "usd_per_hour": self.usd_per_hour,
                "tokens_per_usd": self.tokens_per_usd, "tp": list(self.tp)}

    @classmethod
    def from_dict(cls, d: Json) -> SameBudget:
        return cls(**{**d, "gpus": tuple(d["gpus"]), "tp": tuple(d["tp"])})


@dataclass(frozen=True, kw_only=True)
class CompareRow:
    """One model on one GPU pair (a row of compare.json). A row whose planning failed has ``error`` and
    ``wall_s`` only; ``reference``: the 2×H100 deployment, on a pair only; ``placement`` {} unless Tessera
    chose the MILP placement; ``bound_ratio`` only then too."""

    model: str
    gpus: tuple[str, ...]
    wall_s: float
    error: str | None = None
    link: str = ""
    chosen: str = ""
    images: bool = False
    strategies: dict[str, CompareStrategy] | None = None
    bound_ratio: float | None = None
    solve_s: float | None = None
    best_homogeneous_same_budget: SameBudget | None = None
    reference: SameBudget | None = None
    placement: dict[str, DevicePlacement] | None = None
    provenance: Provenance | None = None

    def to_dict(self) -> Json:
        if self.error is not None:
            return {"model": self.model, "gpus": list(self.gpus), "error": self.error, "wall_s": self.wall_s}
        assert self.strategies is not None and self.best_homogeneous_same_budget is not None  # a planned row
        assert self.placement is not None and self.provenance is not None
        return {"model": self.model, "gpus": list(self.gpus), "link": self.link, "chosen": self.chosen,
                "images": self.images, "strategies": {n: s.to_dict() for n, s in self.strategies.items()},
                "bound_ratio": self.bound_ratio, "solve_s": self.solve_s,
                "best_homogeneous_same_budget": self.best_homogeneous_same_budget.to_dict(),
                "reference": None if self.reference is None else self.reference.to_dict(),
                "placement": _placements_to_dict(self.placement), "provenance": self.provenance.to_dict(),
                "wall_s": self.wall_s}

    @classmethod
    def from_dict(cls, d: Json) -> CompareRow:
        if "error" in d:
            return cls(model=d["model"], gpus=tuple(d["gpus"]), error=d["error"], wall_s=d["wall_s"])
        return cls(**{**d, "gpus": tuple(d["gpus"]),
                      "strategies": {n: CompareStrategy.from_dict(s) for n, s in d["strategies"].items()},
                      "best_homogeneous_same_budget": SameBudget.from_dict(d["best_homogeneous_same_budget"]),
                      "reference": _opt(SameBudget, d["reference"]),
                      "placement": _placements_from_dict(d["placement"]),
                      "provenance": Provenance.from_dict(d["provenance"])})
