"""MoE costs: the monotone repair, the monotone token curve, the routing rule and the transfer, each checked
on hand-made tables against numbers worked out by hand; the shipped costs' monotonicity as an invariant."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tessera.cost.aic import AicCosts
from tessera.cost.moe import TokenCurve, balanced_from_power_law, routing_log_ratios
from tessera.cost.tables import MeasuredTable, Roofline, monotone_in_tokens
from tessera.cost.transfer import TABLE_CONSTANTS, Measured, TableTransfer
from tessera.hardware import gpu

MIXTRAL = (4096, 14336, 2, 8)  # hidden, inter, topk, experts


def test_monotone_repair_is_the_running_minimum_from_above_per_shape() -> None:
    # two model shapes, rows shuffled; shape A: 1.0, 3.0, 2.0, 2.5 ms at 1, 2, 4, 8 tokens -> 2 tokens takes
    # the 2.0 measured at 4; shape B (one token count out of order: 0.9 at 16 after 1.2 at 8) -> 8 gets 0.9
    points = np.array([[4, *MIXTRAL], [1, *MIXTRAL], [8, 2048, 768, 8, 128], [2, *MIXTRAL], [8, *MIXTRAL],
                       [16, 2048, 768, 8, 128], [4, 2048, 768, 8, 128]])
    ms = np.array([2.0, 1.0, 1.2, 3.0, 2.5, 0.9, 0.5])
    assert monotone_in_tokens(points, ms).tolist() == [2.0, 1.0, 0.9, 2.0, 2.5, 0.9, 0.5]


def test_monotone_repair_leaves_ordered_rows_alone() -> None:
    points = np.array([[1, *MIXTRAL], [2, *MIXTRAL], [4, *MIXTRAL]])
    assert monotone_in_tokens(points, np.array([1.0, 1.0, 2.0])).tolist() == [1.0, 1.0, 2.0]


def test_token_curve_by_hand() -> None:
    # grid 1, 4, 16 tokens at 1, 3, 2 ms: repaired 1, 2, 2. At 2 tokens, halfway in log between 1 and 4:
    # sqrt(1 * 2) = 1.414 ms; at 8, between 2 and 2: 2 ms; past the grid the raw scaling, never below 2 ms
    raw = {1: 1.0, 4: 3.0, 16: 2.0}
    c = TokenCurve.of(np.array([16, 1, 4]), lambda n: raw[n])
    assert c.time_s.tolist() == [1.0, 2.0, 2.0]
    assert c.at(2, lambda n: 99.0) == pytest.approx(math.sqrt(2.0))
    assert c.at(8, lambda n: 99.0) == pytest.approx(2.0)
    assert c.at(32, lambda n: 1.5) == 2.0 and c.at(32, lambda n: 4.0) == 4.0


def _table(g: str, rows: list[tuple[int, ...]], ms: list[float], name: str = "moe") -> MeasuredTable:
    return MeasuredTable(name=name, gpu=gpu(g), points=np.array(rows), time_s=np.array(ms) * 1e-3)


def test_routing_rule_by_hand() -> None:
    s1, s2 = (64, *MIXTRAL), (128, *MIXTRAL)
    # balanced / power-law on GPU a: 1.1 at s1, 1.0 at s2; on GPU b: 0.9 at s1 (b has no s2)
    pl = "moe_power_law"
    pairs = [(_table("H100-SXM", [s1, s2], [1.1, 2.0]), _table("H100-SXM", [s1, s2], [1.0, 2.0], pl)),
             (_table("H200", [s1], [0.9]), _table("H200", [s1], [1.0], pl))]
    r = routing_log_ratios(pairs)
    assert r[s1] == pytest.approx((math.log(1.1) + math.log(0.9)) / 2) and r[s2] == pytest.approx(0.0)
    # A100's power-law rows: 2 ms at s1, 3 ms at s2, 5 ms at a shape nobody measured both ways (left out).
    # s1: 2 * sqrt(1.1 * 0.9) = 2 * 0.99499 = 1.98997 ms; s2: 3 ms
    a100 = _table("A100-80GB-SXM", [s1, s2, (64, 2048, 768, 8, 128)], [2.0, 3.0, 5.0], pl)
    d = balanced_from_power_law(a100, r)
    assert d.name == "moe" and d.points.tolist() == [list(s1), list(s2)]
    assert d.time_s * 1e3 == pytest.approx([1.98997, 3.0], rel=1e-5)


BASIS = Roofline(compute_eff=0.5, memory_eff=0.8, launch_s=10e-6)


def test_moe_transfer_to_h20_by_hand() -> None:
    # Mixtral's MoE block at 64 tokens carried to H20 (148 TFLOP/s bf16, 4.0 TB/s) from H100 and H200, both
    # with rooflines c = 0.5, m = 0.8, floor 10 us and measured 1.2x and 0.9x their roofline there.
    # H20's roofline: the same efficiencies (every source has them), floor 10 us (H20 publishes no clock).
    #   compute: 6 * 64 * 2 * 4096 * 14336 = 45,097,156,608 FLOP / 148e12 = 304.71 us -> / 0.5 = 609.42 us
    #   memory: 8 experts hit (1 - (7/8)^128 ~ 1); 2 B * (3 * 8 * 4096 * 14336 + 2 * 64 * 4096)
    #           = 2,819,620,864 B / 4.0e12 = 704.91 us -> / 0.8 = 881.13 us
    #   fit = 10 + 881.13 = 891.13 us
    # weights exp(-d / 0.25), d = |ln(989.4 / 148)| + |ln bandwidth ratio|: the peak terms cancel, so
    #   w_H100 / w_H200 = exp((ln(4.8 / 4.0) - ln(4.0 / 3.35)) / 0.25) = exp((0.18232 - 0.17733) / 0.25)
    #                   = 1.02016
    #   w_H100 = 0.50499, w_H200 = 0.49501
    # time = 891.13 * exp(0.50499 ln 1.2 + 0.49501 ln 0.9) = 891.13 * exp(0.039914) = 891.13 * 1.040721
    #      = 927.42 us
    key = (64, *MIXTRAL)
    sources = []
    for name, rho in (("H100-SXM", 1.2), ("H200", 0.9)):
        fit = MeasuredTable(name="moe", gpu=gpu(name), points=np.array([key]), time_s=np.array([1.0]),
                            basis=BASIS).roofline_s(np.array([key]))[0]
        sources.append(Measured(table=MeasuredTable(name="moe", gpu=gpu(name), points=np.array([key]),
                                                    time_s=np.array([rho * fit]), basis=BASIS)))
    x = TableTransfer(target=gpu("H20"), sources=tuple(sources), constants=TABLE_CONSTANTS["moe"])
    assert x.time_s(key) == pytest.approx(927.42e-6, rel=2e-4)


def test_shipped_moe_costs_never_fall_as_tokens_grow() -> None:
    # measured (H100), derived from power-law rows (A100) and transferred (H20), on the grid's Mixtral shape
    # and a shape no table holds (64 experts, topk 8)
    costs = AicCosts()
    tokens = np.unique(np.round(np.geomspace(1, 40000, 120)).astype(int))
    for g in ("H100-SXM", "A100-80GB-SXM", "H20"):
        for shape in (MIXTRAL, (3584, 2560, 8, 64)):
            t = np.array([costs.moe_s(gpu(g), "moe", (int(n), *shape)) for n in tokens])
            assert (np.diff(t) >= 0).all(), (g, shape, tokens[1:][np.diff(t) < 0])


def test_a100_moe_comes_from_its_power_law_rows_and_is_nobodys_source() -> None:
    costs = AicCosts()
    a100 = gpu("A100-80GB-SXM")
    assert costs.derived(a100.name, "moe") and not costs.is_source(a100.name, "moe")
    assert costs.source(a100) == "measured tables (gemm_fp8, moe_fp8_block transferred; moe from power-law routing rows)"
    sources = {s.table.gpu.name for s in costs.transfer(gpu("H20"), "moe").sources}
    assert sources == {"H100-SXM", "H200", "L40S", "RTX-PRO-6000", "B200", "B300", "GB200", "GB300"}
