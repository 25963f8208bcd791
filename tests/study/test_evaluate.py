"""The evaluation study's hand-checkable pieces: shapes from traces, gain statistics, price sensitivity
arithmetic, the headline check, the matrix's extent and resumption. No planning, no capture."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tessera.cli import main
from tessera.contracts.study import (
    EvalCell,
    EvalStudy,
    FleetAnswer,
    SameSize,
    Stats,
    StrategyEntry,
    TesseraAnswer,
)
from tessera.errors import UserError
from tessera.report import evalsummary as es
from tessera.report.evalsummary import answer
from tessera.study.evaluate import (
    BASE_LINK,
    MODEL_SHAPES,
    POOLS,
    QUICK,
    evaluate_study,
    load_cells,
    matrix,
    sensitivity_links,
)
from tessera.study.workloads import Shape, shapes, trace_shape

DATA = Path(__file__).parents[2] / "tessera" / "sim" / "data"


def test_trace_shape_is_the_rounded_mean() -> None:
    # prompts 100, 300, 201: mean 200.33 -> 200; outputs 10, 30, 21: mean 20.33 -> 20
    s = trace_shape("t", np.array([[100, 10], [300, 30], [201, 21]]), "hand")
    assert (s.prompt, s.output) == (200, 20)
    assert s.source == "hand: mean of 3 requests"
    # halves round up: prompts 1, 2 -> 1.5 -> 2; outputs 3, 4 -> 3.5 -> 4
    s = trace_shape("t", np.array([[1, 3], [2, 4]]), "hand")
    assert (s.prompt, s.output) == (2, 4)
    with pytest.raises(UserError, match="rows of"):
        trace_shape("t", np.array([1, 2, 3]), "hand")


def test_shipped_trace_shapes_match_an_independent_reading() -> None:
    for name, f in (("conversation", "azure_conv_2023.json"), ("code", "azure_code_2023.json")):
        rows = json.loads((DATA / f).read_text())["rows"]
        want = (round(statistics.mean(r[0] for r in rows)), round(statistics.mean(r[1] for r in rows)))
        s = shapes()[name]
        assert (s.prompt, s.output) == want
        assert f in s.source
    # code: long prompts, short answers; reason: the opposite; summarise: prompts inside 4k-8k
    sh = shapes()
    assert sh["code"].prompt > 20 * sh["code"].output
    assert sh["reason"].output >= 2048 and sh["reason"].prompt < 1024
    assert 4096 <= sh["summarise"].prompt <= 8192 and sh["image-1024"].steps == 28


def test_shape_rejects_bad_numbers() -> None:
    with pytest.raises(UserError, match="prompt=0"):
        Shape(name="x", prompt=0, source="s")
    with pytest.raises(UserError, match="no source"):
        Shape(name="x", source="")


def test_matrix_extent_and_quick_subset() -> None:
    full = matrix()
    base = [x for x in full if x[3] == BASE_LINK]
    families_with_4 = [m for m, ss in MODEL_SHAPES.items() if len(ss) >= 4]
    assert len(families_with_4) >= 4
    pools = {p.name for _, _, p, _ in base}
    assert len(pools) >= 6 and sum(1 for p in POOLS if 8 <= p.size <= 16) >= 2
    assert len({p.size for p in POOLS}) == 4  # pools of 2, 4, 8 and 16 GPUs
    assert max(len(p.gpus) for p in POOLS) == 5  # a pool of five GPU types
    assert len(base) == len(pools) * sum(len(ss) for ss in MODEL_SHAPES.values())
    keys = {(m, s, p.name, lk) for m, s, p, lk in full}
    assert len(keys) == len(full)  # no cell twice
    assert {(m, s, POOLS[i].name, BASE_LINK) for m, s, i in QUICK} <= keys
    # the link sensitivity runs a pair only at links it can be built with: H100 + L40S (a Gen4 card, no shared
    # NVLink) at PCIe 3 and 100 GbE beside its best, PCIe 4; two H100s at PCIe 5 beside NVLink 4
    assert {lk for _, _, p, lk in full if p.name == "H100-SXM+L40S"} == {BASE_LINK, "pcie3", "eth100"}
    assert sensitivity_links(next(p for p in POOLS if p.name == "2xH100-SXM")) == ("pcie5", "eth100")


def test_stats_best_median_worst() -> None:
    assert es.stats([1.0, 2.0, 1.5, 0.5]) == Stats(best=2.0, median=1.25, worst=0.5, n=4)
    assert es.stats([]) is None


def _cell(pool: str, gpus: list[tuple[str, int]], good: dict[str, float], chosen: str, *,
          same: list[tuple[str, float]], model: str = "m", shape: str = "s", link: str = BASE_LINK) -> EvalCell:
    prices = {"H100-SXM": 2.99, "L40S": 1.1, "H200": 3.99}
    used = {g: n for g, n in gpus}
    n = sum(used.values())
    usd = sum(prices[g] * k for g, k in used.items())
    return EvalCell(model=model, family="f", shape=shape, prompt=100, output=10, steps=1, images=False, pool=pool,
                    gpus=tuple(gpus), n_gpus=n, link=link, link_used="pcie4", prices=prices,
                    strategies={k: StrategyEntry(goodput_per_s=v, usd_per_hour=usd, applicable=True, feasible=v > 0,
                                                 reason=None, tp=(1,), batch=1, microbatches=1, knee=None)
                                for k, v in good.items()},
                    tessera=TesseraAnswer(goodput_per_s=good["tessera"], chosen=chosen, source="cell", used=used,
                                          usd_per_hour=usd),
                    same_size=tuple(SameSize(gpu=g, count=n, goodput_per_s=v, tp=(1,), usd_per_hour=0.0)
                                    for g, v in same))


def _study(cells: list[EvalCell]) -> EvalStudy:
    return EvalStudy(cells=tuple(cells), summary=es.summary(cells), shapes={})


PAIR = _cell("H100-SXM+L40S", [("H100-SXM", 1), ("L40S", 1)],
             {"tessera": 1000.0, "homogeneous": 800.0, "prefill_decode": 500.0, "attention_ffn": 0.0,
              "layer_pipeline": 900.0}, "milp", same=[("H100-SXM", 1500.0), ("L40S", 400.0), ("H200", 1600.0)])


def test_gain_and_price_sensitivity_by_hand() -> None:
    assert es.best_baseline(PAIR) == ("layer_pipeline", 900.0)
    assert es.goodput_gain(PAIR) == pytest.approx(1000 / 900)
    assert es.kernel_level(PAIR) and es.became(PAIR) == "milp"
    # list prices: Tessera 1000·3600/4.09 = 880,195.6 tok/$; 2×H100 1500·3600/5.98 = 903,010.0;
    # 2×L40S 400·3600/2.2 = 654,545.5; 2×H200 1600·3600/7.98 = 721,804.5 -> best 2×H100, gain 0.97474
    assert es.same_size_best(PAIR) == ("2xH100-SXM", pytest.approx(903_010.03, rel=1e-6))
    assert es.per_usd_gain(PAIR) == pytest.approx(0.974735, rel=1e-5)
    # L40S −30%: pool 2.99 + 0.77 = 3.76 $/h -> 957,446.8; 2×L40S at 1.54 $/h -> 935,064.9 (now the best)
    # -> 1.02394
    assert es.same_size_best(PAIR, {"L40S": 0.7})[0] == "2xL40S"
    assert es.per_usd_gain(PAIR, {"L40S": 0.7}) == pytest.approx(1.023936, rel=1e-5)
    # H100 +30%: pool 3.887 + 1.1 = 4.987 $/h -> 721,876.9; 2×H200 721,804.5 now beats 2×H100 at 7.774 $/h
    # (694,623.1) -> 1.0001003
    assert es.per_usd_gain(PAIR, {"H100-SXM": 1.3}) == pytest.approx(1.0001003, rel=1e-6)
    rows = {r.scenario: r for r in es.price_sensitivity([PAIR])}
    assert rows["list prices"].beats_same_size == 0 and rows["L40S −30%"].beats_same_size == 1


def test_tie_names_the_baseline_and_fleet_of_baselines_is_a_baseline() -> None:
    tie = _cell("2xH100-SXM", [("H100-SXM", 2)], {"tessera": 1500.0, "homogeneous": 1500.0, "prefill_decode": 0.0,
                                                 "attention_ffn": 0.0, "layer_pipeline": 1400.0},
                "homogeneous", same=[("H100-SXM", 1500.0)])
    assert es.goodput_gain(tie) == 1.0 and not es.kernel_level(tie) and es.became(tie) == "homogeneous"
    big = _cell("4xH100-SXM+4xL40S", [("H100-SXM", 4), ("L40S", 4)],
                {"tessera": 100.0, "homogeneous": 100.0, "prefill_decode": 0.0, "attention_ffn": 0.0,
                 "layer_pipeline": 50.0}, "homogeneous", same=[("H100-SXM", 150.0)])
    big = replace(big, fleet=FleetAnswer(goodput_per_s=120.0, milp_cells=0,
                                         cells="4x(H100-SXM+L40S = prefill_decode)"),
                  tessera=replace(answer(big), goodput_per_s=120.0, source="fleet", chosen="fleet: ..."))
    assert es.best_baseline(big) == ("replicated 4x(H100-SXM+L40S = prefill_decode)", 120.0)
    assert es.goodput_gain(big) == 1.0 and not es.kernel_level(big)


def test_headline_pair_against_two_h100() -> None:
    # 2×H100 (its own cell) serves 1500 tok/s at 5.98 $/h: 903,010 tok/$; the pair 1000 tok/s at 4.09 $/h
    # (880,196 tok/$): slower and dearer per token. 2×H200 (same-size entry): 1600 at 7.98 $/h, 721,805 tok/$:
    # the pair is slower but cheaper per token.
    ref = _cell("2xH100-SXM", [("H100-SXM", 2)], {"tessera": 1500.0, "homogeneous": 1500.0, "prefill_decode": 0.0,
                                                 "attention_ffn": 0.0, "layer_pipeline": 0.0},
                "homogeneous", same=[("H100-SXM", 1500.0)])
    h = {r.reference: r for r in es.headline([PAIR, ref])}
    assert not h["2xH100-SXM"].beats_throughput and not h["2xH100-SXM"].beats_per_usd
    assert not h["2xH200"].beats_throughput and h["2xH200"].beats_per_usd and not h["2xH200"].both
    md = es.markdown(_study([PAIR, ref]))
    assert "| m | s | 2xH200 | 1,600 | 1,000 (H100-SXM+L40S) | no | 1.22× (H100-SXM+L40S) | yes | no |" in md


def test_load_cells_drops_a_torn_last_line(tmp_path) -> None:
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps(PAIR.to_dict()) + "\n" + '{"model": "b", "sha')
    assert load_cells(p) == [PAIR]


def test_cli_bad_limit_exits_2(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["evaluate", "--limit", "-1"])
    assert e.value.code == 2


def test_milp_within_margin_is_a_tie_and_html_section_escapes() -> None:
    near = _cell("H100-SXM+L40S", [("H100-SXM", 1), ("L40S", 1)],
                 {"tessera": 1004.0, "homogeneous": 800.0, "prefill_decode": 0.0, "attention_ffn": 0.0,
                  "layer_pipeline": 1000.0}, "milp", same=[("H100-SXM", 1500.0)])
    assert not es.kernel_level(near) and es.became(near) == "milp ≈ layer_pipeline"  # 1.004 < 1.005
    h = es.html_section(_study([PAIR]), [("best", "figures/eval.best_placement.png")])
    assert h.startswith('<section id="evaluation">') and "≈" not in h.split("<pre>")[0]
    assert '<img src="figures/eval.best_placement.png"' in h and "<figure>" in h


def test_k_plus_k_pool_replicates_the_pair_and_its_best_baseline() -> None:
    from tessera.study.evaluate import StudyPool, pair_of, replicated_pair

    big = StudyPool(name="8xH100-SXM+8xL40S", gpus=(("H100-SXM", 8), ("L40S", 8)))
    pair = PAIR
    assert pair_of(big, "m", "s", BASE_LINK, [pair]) is pair
    assert pair_of(big, "m", "s", "nvlink4", [pair]) is None
    f = replicated_pair(big, pair)
    # 8 × (1000 tok/s, MILP), 8 × its best baseline (layer pipeline, 900 tok/s)
    assert f.goodput_per_s == 8000.0 and f.baseline_goodput_per_s == 7200.0 and f.milp_cells == 1
    assert f.used == {"H100-SXM": 8, "L40S": 8} and f.usd_per_hour == pytest.approx(8 * 4.09)
    cell = replace(PAIR, n_gpus=16, fleet=f,
                   tessera=replace(answer(PAIR), goodput_per_s=8000.0, source="fleet", used=f.used))
    assert es.best_baseline(cell) == ("replicated 8x(H100-SXM+L40S = layer_pipeline)", 7200.0)


def test_evaluate_study_shows_what_it_wrote(tmp_path) -> None:
    """`tessera evaluate` prints the files' own markdown and summary (no cell run: --limit 0)."""
    e = evaluate_study(out_dir=tmp_path, quick=True, limit=0)
    assert e.markdown == (tmp_path / "eval.quick.md").read_text()
    assert e.summary.to_dict() == json.loads((tmp_path / "eval.quick.json").read_text())["summary"]
    assert "PARTIAL: 0 of 8 cells" in e.markdown  # the quick matrix is 8 cells (evaluate --help)
    assert e.maps == ()  # no cell, no best or worst placement to draw


def test_markdown_names_only_the_placement_maps_drawn() -> None:
    """No cell here has a single-cell placement, so no map is drawn and the heading names none (it used
    to name eval.best_placement.png and eval.worst_placement.png whatever was drawn, quick runs included)."""
    md = es.markdown(_study([PAIR]), "eval.quick")
    assert "## Best and worst cells (placement maps: none)" in md and "eval.worst_placement" not in md
