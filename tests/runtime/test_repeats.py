"""The paired-repeats speed-up and its confidence bound: Student's t quantiles against printed tables, and
the bound worked out by hand."""

import math

import pytest

from tessera.runtime.repeats import paired_ratio, t_quantile


@pytest.mark.parametrize(("p", "df", "table"), [
    # one-sided quantiles as printed in standard t tables (3 decimals)
    (0.90, 1, 3.078), (0.90, 4, 1.533), (0.90, 10, 1.372), (0.95, 1, 6.314), (0.95, 4, 2.132),
    (0.975, 2, 4.303), (0.99, 1, 31.821), (0.99, 30, 2.457), (0.999, 1, 318.309)])
def test_t_quantile_matches_printed_tables(p, df, table):
    assert t_quantile(p, df) == pytest.approx(table, abs=6e-4)


def test_t_quantile_tends_to_the_normal():
    assert t_quantile(0.9, 100_000) == pytest.approx(1.2816, abs=1e-3)  # the normal's 90% quantile
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-9)


def test_bound_by_hand():
    # pairs 2 and 4: logs ln2, ln4, mean ln(2·√2), sd (ln4 − ln2)/√2, se = sd/√2 = ln2/2;
    # lower = 2√2 · exp(−3.078 · ln2 / 2) = 2√2 · 2^−1.539 ≈ 0.973
    pr = paired_ratio([2.0, 4.0], [1.0, 1.0])
    assert pr.pairs == (2.0, 4.0)
    assert pr.geomean == pytest.approx(2 * math.sqrt(2))
    assert pr.lower == pytest.approx(2 * math.sqrt(2) * 2 ** (-3.078 / 2), rel=1e-3)
    assert pr.lower == pytest.approx(0.973, abs=1e-3)


def test_equal_pairs_have_no_spread_and_one_pair_no_bound():
    pr = paired_ratio([33.0, 22.0, 11.0], [30.0, 20.0, 10.0])
    assert pr.geomean == pytest.approx(1.1) and pr.lower == pytest.approx(1.1)
    one = paired_ratio([12.0], [10.0])
    assert one.geomean == pytest.approx(1.2) and one.lower is None


def test_bound_is_below_the_mean_and_widens_with_confidence():
    a, b = [37.3, 32.9, 31.9, 37.7, 36.8], [26.7, 28.0, 28.9, 29.6, 27.5]
    p90, p95 = paired_ratio(a, b), paired_ratio(a, b, confidence=0.95)
    assert p95.lower < p90.lower < p90.geomean == pytest.approx(p95.geomean)


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="as many runs"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="confidence"):
        paired_ratio([1.0, 2.0], [1.0, 1.0], confidence=1.0)
    with pytest.raises(ValueError, match="t_quantile needs"):
        t_quantile(0.4, 3)
    with pytest.raises(ValueError, match="positive"):
        paired_ratio([0.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        paired_ratio([float("nan")], [1.0])


def test_serve_run_summary_reads_the_bound_from_paired_repeats():
    from tessera.runtime.serve_api import ServeRunResult, speedup

    ratio = speedup({"async": [2.0, 4.0], "sync": [1.0, 1.0]})  # the pairs of test_bound_by_hand
    assert ratio["pairs"] == (2.0, 4.0) and ratio["geomean"] == pytest.approx(2 * math.sqrt(2))
    assert ratio["lower"] == pytest.approx(0.973, abs=1e-3) and ratio["confidence"] == 0.9
    assert speedup({"async": [1.0]}) is None  # no sync run
    assert speedup({"async": [1.0, 2.0], "sync": [1.0, 0.0]}) is None  # a run that generated nothing
    res = ServeRunResult(model="m", devices=("cpu", "cpu"), placement="layer_split", schedule="async",
                         requests=1, completed=1, lost=0, verified=True, tokens_identical=True,
                         max_abs_diff=0.0, measured_throughput_tokens_per_s=4.0,
                         predicted_throughput_tokens_per_s=None, simulated_throughput_tokens_per_s=None,
                         sync_throughput_tokens_per_s=1.0, ttft_s={"p50": None, "p99": None},
                         tpot_s={"p50": None, "p99": None}, extra={"async_over_sync": ratio})
    assert "(async/sync 2.83x over 2 paired repeats, 90% lower bound 0.97x)" in res.summary()
