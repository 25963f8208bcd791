"""The first screen: what to rent with one capacity and one price at the stated SLO, the simulation that checks
it, how sure; gains as best / median / worst; weight copies; every plan at its own rate. Numbers worked by
hand from the inputs."""

from __future__ import annotations

import re
from dataclasses import replace
from html import unescape
from types import SimpleNamespace

import pytest
from report_inputs import compare_cells, of_plan, sim_result, toy_plan

from tessera.contracts.plan import PoolCell, PoolPlan
from tessera.graph import Buffer, Kernel, KernelKind, Role, build_graph
from tessera.report.answer import Spread, answer_of, matrix_gains, placement_words, weight_copies
from tessera.report.data import RentOption, ReportData, parse_cell, parse_sim
from tessera.report.html import build_report
from tessera.study.report_facts import with_facts

OUT_TOKENS, RATE, CAPACITY = 256, 5.0, 1600.0  # offered 5 req/s × 256 = 1280 tok/s = 80% of 1600


def run(label: str, seed: int, tok_s: float, met: float, *, rate: float = RATE, capacity: float = CAPACITY,
        completed: int = 1000) -> dict:
    return {**sim_result(1.0), "label": label, "seed": seed, "throughput_tokens_per_s": tok_s,
            "slo_attainment": met, "completed": completed, "rate_per_s": rate, "capacity_tokens_per_s": capacity,
            "output_tokens": OUT_TOKENS, "slo_ttft_s": 2.0, "slo_tpot_s": 0.1}


def seeds_data(**kw) -> ReportData:
    """Tessera (planned goodput 1600 tok/s) at 80% of it over three seeds, a baseline at its own rate, a sweep,
    two options."""
    sims = [run("tessera", 0, 1250.0, 1.0), run("tessera", 1, 1270.0, 0.99), run("tessera", 2, 1290.0, 0.98),
            run("layer_pipeline", 0, 600.0, 1.0, rate=2.5, capacity=800.0)]
    sweep = [run("tessera", 0, 800.0, 1.0, rate=3.125), run("tessera", 0, 1590.0, 0.995, rate=6.25),
             run("tessera", 0, 700.0, 0.4, rate=7.5)]  # 50%, 100%, 120% of capacity
    options = (RentOption(label="2×H100-SXM", gpus=("H100-SXM", "H100-SXM"), usd_per_hour=5.98,
                          goodput_tokens_per_s=3000.0, source="planner prediction"),
               RentOption(label="1×L40S", gpus=("L40S",), usd_per_hour=1.10, goodput_tokens_per_s=200.0,
                          source="planner prediction"))
    args = dict(plan=replace(toy_plan(), goodput_per_s=CAPACITY), sims=tuple(parse_sim(s, s["label"], "t") for s in sims),
                sweep=tuple(parse_sim(s, s["label"], "t") for s in sweep), options=options)
    return with_facts(ReportData(**{**args, **kw}))  # the GPUs' catalog entries, the planned goodput


def test_goodput_and_load_of_one_run_by_hand() -> None:
    s = parse_sim(run("tessera", 1, 1270.0, 0.99, completed=990), "tessera", "t")
    # 99% of 1000 requests met the SLO, 990 completed: 1270 tok/s × 0.99 × 1000 / 990 = 1270 tok/s
    assert s.goodput_tokens_per_s == pytest.approx(1270.0)
    assert s.offered_tokens_per_s == pytest.approx(1280.0) and s.load == pytest.approx(0.8)


def test_answer_numbers_derived_from_the_inputs() -> None:
    a = answer_of(seeds_data())
    assert a is not None and a.gpus == ("H100-SXM", "L40S") and a.usd_per_hour == 4.09
    # goodput = throughput × attainment (every request completed): 1250, 1257.3, 1264.2 tok/s
    assert (a.goodput.lo, a.goodput.mid, a.goodput.hi) == pytest.approx((1250.0, 1257.3, 1264.2))
    assert a.goodput.n == 3 and a.goodput.rel_half_width == pytest.approx(7.1 / 1257.3)
    assert a.rate_per_s == RATE and a.load == pytest.approx(0.8) and a.capacity_tokens_per_s == CAPACITY
    assert (a.slo_ttft_s, a.slo_tpot_s) == (2.0, 0.1)
    # sim_result's p99s are 4 × 0.1 s and 4 × 0.01 s, equal over seeds
    assert a.worst_ttft_p99_s == pytest.approx(0.4) and a.worst_tpot_p99_s == pytest.approx(0.04)
    # one price: 4.09 $/h at the planned 1600 tok/s = 4.09e6 / (1600 × 3600) = $0.7101/M; 2×H100 at $5.98/h for
    # 3000 tok/s: $0.5537/M, cheaper, and the best of one type; the L40S ($1.528/M) is dearer per token
    assert a.predicted_usd_per_million_tokens == pytest.approx(4.09 / (1600 * 3600) * 1e6)
    assert a.cheaper is not None and a.cheaper.label == "2×H100-SXM" and a.homogeneous == a.cheaper
    assert a.cheaper.usd_per_million_tokens == pytest.approx(5.98 / (3000 * 3600) * 1e6)
    # the sweep meets the SLO for ≥ 99% up to 100% of capacity, 40% at 120%
    assert a.saturation() == (pytest.approx(1.0), pytest.approx(1.2))


def lead_text(page: str) -> str:
    lead = unescape(re.sub(r"<[^>]+>", " ", page.split('<div class="lead">', 1)[1].split("</div>", 1)[0]))
    return re.sub(r" ([.,;:)])", r"\1", " ".join(lead.split()))


def test_first_screen_states_one_capacity_one_price_and_the_check(tmp_path) -> None:
    lead = lead_text(build_report(seeds_data(), tmp_path).read_text())
    assert ("Rent 1× H100-SXM + 1× L40S ($4.09/h) and serve toy<2L> with Tessera's kernel placement: "
            "1,600 tok/s at the SLO, $0.710/M tokens.") in lead
    assert "6,595" not in lead  # nothing from the demo: every number below is from this test's inputs
    # one capacity, one price: no other $/M figure for this deployment and no other capacity
    assert lead.count("$0.710/M") == 1 and "$0.904" not in lead and "1,600 tok/s" in lead
    assert ("at 5.00 requests/s, Poisson (80% of the capacity): 1,257 tok/s (median; 1,250 to 1,264 over 3 seeds) "
            "met the SLO; requests meeting it 99.0% (median; 98.0% to 100.0% over 3 seeds)") in lead
    assert "TTFT ≤ 2,000 ms, TPOT ≤ 100 ms" in lead
    assert "Simulated goodput varies ±0.6% over 3 seeds" in lead
    assert "Worst seed: p99 TTFT 0.40 s of 2 s, p99 TPOT 40 ms of 100 ms" in lead
    assert "20% headroom below saturation" in lead
    assert "up to 100% of capacity and 40% at 120%" in lead
    # 0.7101 / 0.5537 = 1.28: both at predicted capacity
    assert "If you can rent other GPUs: 2× H100-SXM serves a token 1.28× cheaper (predicted" in lead
    assert "Best option of one GPU type 2× H100-SXM: 3,000 tok/s for $5.98/h, $0.554/M tokens, 1.28× cheaper" in lead
    assert "cost model's measured error was not given" in lead and "Planner vs simulator: not checked" in lead


def test_first_screen_says_so_when_one_seed_and_above_saturation(tmp_path) -> None:
    data = seeds_data(sims=(parse_sim(run("tessera", 0, 1250.0, 0.5, rate=7.5), "tessera", "t"),), sweep=None)
    lead = unescape(re.sub(r"<[^>]+>", " ", build_report(data, tmp_path).read_text()))
    assert "(one seed: no spread)" in lead
    assert "20% above saturation" in " ".join(lead.split())  # 7.5 × 256 = 1920 = 120% of 1600


def test_matrix_gains_best_median_worst_by_hand(tmp_path) -> None:
    cells = [parse_cell(c, "t") for c in compare_cells()]
    g = matrix_gains(cells)["goodput vs best baseline, same GPUs"]
    # 3000/2500 = 1.2, 3600/3300 = 1.0909, 9000/8500 = 1.0588, 1.5/1.3 = 1.1538: median (1.0909 + 1.1538) / 2
    assert (g.best, g.median, g.worst, g.cells) == pytest.approx((1.2, 1.12238, 9000 / 8500, 4), rel=1e-4)
    assert g.best_cell == "llama-3-70b on H100-SXM+L40S" and g.worst_cell == "mamba-2<x> on H100-SXM+L40S"
    page = build_report(ReportData(compare=tuple(cells)), tmp_path).read_text()
    assert "1.20× (llama-3-70b on H100-SXM+L40S)</td><td class=num>1.12×</td><td class=num>1.06× " \
           "(mamba-2&lt;x&gt; on H100-SXM+L40S)" in page
    # no same-size homogeneous reference in these cells: that ratio is left out, not invented
    assert "per $ vs best same-size homogeneous" not in page


def test_per_dollar_gain_reads_the_compare_reference() -> None:
    raw = compare_cells()[0] | {"best_homogeneous_same_budget": {"gpus": ["H100-SXM", "H100-SXM"],
                                                                 "goodput": 5000.0, "usd_per_hour": 5.98}}
    c = parse_cell(raw, "t")
    # Tessera 3000 tok/s for $4.09/h against 5000 for $5.98/h: (3000 / 4.09) / (5000 / 5.98) = 0.8773
    assert c.per_dollar_gain() == pytest.approx((3000 / 4.09) / (5000 / 5.98))
    assert c.reference.label == "2×H100-SXM"


def two_weight_graph(w0_bytes: int, w1_bytes: int):
    """k0 reads w0, k1 and k2 read w1 (all GEMMs of layer 0)."""
    bufs = [Buffer(id=0, name="w0", bytes=w0_bytes, role=Role.WEIGHT),
            Buffer(id=1, name="w1", bytes=w1_bytes, role=Role.WEIGHT), Buffer(id=2, name="x", bytes=8, role=Role.INPUT)]
    ks = [Kernel(id=i, name=f"k{i}", kind=KernelKind.GEMM, flops=1, bytes_read=1, bytes_written=1, reads=(w, 2),
                 writes=(2,), layer=0) for i, w in enumerate((0, 1, 1))]
    return build_graph(model="toy<2L>", phase="decode", shape={}, kernels=ks, buffers=bufs)


def test_weight_copies_by_hand() -> None:
    # k0 (w0) and k2 (w1) on d0, k1 (w1) on d1: d0 holds 400 bytes, d1 300; w1 is held twice
    wc = weight_copies(two_weight_graph(100, 300), (0, 1, 0), 2)
    assert wc.held_bytes == (400, 300) and wc.unique_bytes == 400
    assert wc.shared_bytes == 300 and wc.duplicated_bytes == 300


def test_memory_section_explains_duplicated_weights(tmp_path) -> None:
    plan = toy_plan()
    plan = replace(plan, phases={"decode": replace(plan.phases["decode"], assignment=(0, 1, 0))})
    page = build_report(ReportData(plan=plan, graphs=(two_weight_graph(10**9, 3 * 10**9),)), tmp_path).read_text()
    # the toy plan's memory table: 30 + 12 GB of weights
    assert ("Weights: 4.0 GB in the model, 7.0 GB held over the devices</b> (d0 H100-SXM 4.0 GB, d1 L40S 3.0 GB; "
            "the plan's memory table says 42.0 GB)") in page
    assert "3.0 GB of weights are used by kernels on more than one device, so 3.0 GB are copies" in page
    assert "Prefill/decode holds every layer on both sides" in page


def test_each_plan_at_its_own_rate_and_one_shared_rate_is_flagged(tmp_path) -> None:
    page = build_report(seeds_data(), tmp_path).read_text()
    assert "Each plan is run at its own rate, 80% of its own predicted capacity" in page  # 2.5 × 256 / 800
    assert "<td>tessera</td><td class=num>5</td><td class=num>80%</td><td class=num>3</td>" in page
    assert "<td>layer_pipeline</td><td class=num>2.5</td><td class=num>80%</td><td class=num>1</td>" in page
    same = seeds_data(sims=tuple(parse_sim(run(lbl, 0, 1000.0, 1.0), lbl, "t") for lbl in ("tessera", "homogeneous")))
    page = build_report(same, tmp_path / "same").read_text()
    assert "Every plan was run at one rate, 5 requests/s" in page


def test_demo_runs_every_plan_at_its_own_operating_point() -> None:
    from tessera.study.demo import operating_rates

    def outcome(goodput: float, feasible: bool = True) -> SimpleNamespace:
        return SimpleNamespace(feasible=feasible, plan=object() if feasible else None, goodput=goodput)
    result = SimpleNamespace(config=SimpleNamespace(traffic=SimpleNamespace(output=256)), strategies={
        "tessera": outcome(7324.0), "prefill_decode": outcome(3030.0), "attention_ffn": outcome(0.0, False)})
    # rate = 0.9 × goodput / 256 output tokens per request; an infeasible plan is not run
    assert operating_rates(result, 0.9) == pytest.approx({"tessera": 0.9 * 7324 / 256, "prefill_decode": 0.9 * 3030 / 256})


def test_spread_rejects_disorder() -> None:
    assert Spread.of([3.0, 1.0, 2.0]) == Spread(lo=1.0, mid=2.0, hi=3.0, n=3)
    with pytest.raises(ValueError, match="lo=2.0 mid=1.0"):
        Spread(lo=2.0, mid=1.0, hi=3.0, n=2)


def test_rent_option_rejects_a_free_or_empty_option() -> None:
    with pytest.raises(ValueError, match="usd_per_hour=0"):
        RentOption(label="x", gpus=("L40S",), usd_per_hour=0, goodput_tokens_per_s=1.0, source="s")


def test_cli_reads_the_demo_files_with_rates_and_a_sweep(tmp_path) -> None:
    import json

    from tessera.cli import main
    plan = toy_plan()
    plan.save(tmp_path / "plan.json")
    (tmp_path / "sims.json").write_text(json.dumps([of_plan(run("tessera", s, 1250.0, 1.0), plan) for s in range(3)]))
    (tmp_path / "sweep.json").write_text(json.dumps([of_plan(run("tessera", 0, 800.0, 1.0, rate=3.125), plan),
                                                     of_plan(run("tessera", 0, 700.0, 0.4, rate=7.5), plan)]))
    with pytest.raises(SystemExit) as e:
        main(["report", "-q", "--plan", str(tmp_path / "plan.json"), "--sim", str(tmp_path / "sims.json"),
              "--sweep", str(tmp_path / "sweep.json"), "--out-dir", str(tmp_path / "out")])
    assert e.value.code == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert "1,250 tok/s in each of 3 seeds" in page and 'alt="goodput vs rate"' in page
    assert "up to 50% of capacity and 40% at 120%" in page


def test_weights_held_per_strategy_against_the_model(tmp_path) -> None:
    plan = toy_plan()
    plan = replace(plan, phases={"decode": replace(plan.phases["decode"], assignment=(0, 1, 0))})
    pd = replace(plan, strategy="prefill_decode", memory_bytes=({"weight": 4 * 10**9}, {"weight": 4 * 10**9}))
    one = replace(pd, strategy="homogeneous", memory_bytes=({"weight": 4 * 10**9},))
    homog = PoolPlan(cells=(PoolCell(plan=one, count=2),))  # two independent replicas of one cell
    data = ReportData(plan=plan, graphs=(two_weight_graph(10**9, 3 * 10**9),), baseline_plans=(pd, homog))
    page = build_report(data, tmp_path).read_text()
    # model 4 GB; tessera's table 30 + 12 = 42 GB; prefill/decode 8 GB (2×); two replicas of 4 GB each (2×)
    assert "<td>tessera</td><td class=num>42.0</td><td class=num>10.50×</td><td class=num>38.0</td>" in page
    assert "<td>prefill_decode</td><td class=num>8.0</td><td class=num>2.00×</td><td class=num>4.0</td>" in page
    assert "<td>homogeneous</td><td class=num>8.0</td><td class=num>2.00×</td><td class=num>4.0</td>" in page


def test_a_pool_of_one_gpu_replicas_is_not_called_a_kernel_placement() -> None:
    """Tessera's answer on a pair is often a replica per GPU (its plans still say strategy "tessera"): the
    first screen must say so, not "Tessera's kernel placement"."""
    split = toy_plan()  # kernels over an H100 and an L40S
    phases = {k: replace(v, assignment=(0,) * len(v.assignment)) for k, v in split.phases.items()}
    one = replace(split, devices=split.devices[:1], phases=phases)
    other = replace(one, devices=(replace(split.devices[1], index=0),))
    pool = PoolPlan(cells=(PoolCell(plan=one, count=1), PoolCell(plan=other, count=1)))
    assert placement_words(split) == "Tessera's kernel placement"
    assert placement_words(pool) == "one whole-model replica per GPU behind a router (no kernel split)"
    assert placement_words(replace(split, strategy="layer_pipeline")) == "the layer_pipeline plan"
