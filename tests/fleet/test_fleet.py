"""Fleet planning: pool file, the integer program against hand-worked optima, the lazy search's certificate,
and one real fleet on a tiny model (planner included) with a JSON round trip and a re-plan after a loss."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from tessera.errors import UserError
from tessera.fleet import FleetPlan, FleetSpec, plan_fleet, replan_without
from tessera.fleet.cells import candidate_cells
from tessera.fleet.mix import lazy_mix, solve_mix, verify_mix

A, B = "H100-SXM", "L4"


def test_pool_file_parses_and_validates() -> None:
    s = FleetSpec.parse('link = "pcie5"\n[[gpu]]\ntype = "H100"\ncount = 4\n[[gpu]]\ntype = "L4"\ncount = 2\n')
    assert s.counts == {A: 4, B: 2} and s.total == 6 and s.link == "pcie5"
    assert FleetSpec.parse(s.to_toml()) == s
    assert s.without("H100").counts == {A: 3, B: 2}
    assert FleetSpec.from_counts({"L4": 1}).without("L4", 0).counts == {B: 1}
    with pytest.raises(UserError, match="valid: .*H100-SXM"):
        FleetSpec.parse('[[gpu]]\ntype = "H999"\ncount = 1\n')
    with pytest.raises(UserError, match="count=0"):
        FleetSpec.parse('[[gpu]]\ntype = "L4"\ncount = 0\n')
    with pytest.raises(UserError, match="not TOML"):
        FleetSpec.parse("[[gpu]\n")
    with pytest.raises(UserError, match="cannot lose 3"):
        s.without("L4", 3)


def test_candidate_cells() -> None:
    assert candidate_cells([B, A]) == [(A,), (B,), (A, A), (B, B), (A, B)]


def test_throughput_program_hand_worked() -> None:
    # 3 A, 1 B. Cells: A alone 10/s, B alone 1/s, A+B 13/s, A+A 21/s.
    # Options: 3 singles A + B = 31; A+A, A+B = 34; A+A, A, B = 32; A+B, 2 A = 33. Best 34.
    thr = {(A,): 10.0, (B,): 1.0, (A, B): 13.0, (A, A): 21.0}
    usd = {(A,): 3.0, (B,): 1.0, (A, B): 4.0, (A, A): 6.0}
    s = solve_mix(thr, usd, available={A: 3, B: 1})
    assert s.counts == {(A, A): 1, (A, B): 1} and s.throughput_per_s == pytest.approx(34.0)
    assert verify_mix(s.counts, thr, usd, available={A: 3, B: 1}, budget_usd_per_hour=None) == (34.0, 10.0)
    with pytest.raises(AssertionError, match="uses 4"):
        verify_mix({(A, A): 2}, thr, usd, available={A: 3}, budget_usd_per_hour=None)


def test_per_dollar_program_hand_worked() -> None:
    # ratios: A 10/3 = 3.33, B 1/1, A+B 13/4 = 3.25, A+A 21/6 = 3.5 -> only A+A cells, one of them (2 of 3 A)
    thr = {(A,): 10.0, (B,): 1.0, (A, B): 13.0, (A, A): 21.0}
    usd = {(A,): 3.0, (B,): 1.0, (A, B): 4.0, (A, A): 6.0}
    s = solve_mix(thr, usd, objective="per_dollar", available={A: 3, B: 1})
    assert s.counts == {(A, A): 1} and s.per_dollar == pytest.approx(3.5)


def test_budget_program_hand_worked() -> None:
    # budget 10: A+A (21 for 6) + A+B (13 for 4) = 34; 3 A + B = 31; 2 A+B... needs 8 -> 26; best 34
    thr = {(A,): 10.0, (B,): 1.0, (A, B): 13.0, (A, A): 21.0}
    usd = {(A,): 3.0, (B,): 1.0, (A, B): 4.0, (A, A): 6.0}
    s = solve_mix(thr, usd, budget_usd_per_hour=10.0)
    assert s.throughput_per_s == pytest.approx(34.0) and s.usd_per_hour <= 10.0
    with pytest.raises(UserError, match="unknown objective"):
        solve_mix(thr, usd, objective="speed", budget_usd_per_hour=1.0)


def test_lazy_search_is_exact_when_bounds_hold() -> None:
    true = {(A,): 10.0, (B,): 1.0, (A, B): 13.0, (A, A): 21.0}
    bound = {(A,): 10.0, (B,): 1.0, (A, B): 20.0, (A, A): 25.0}
    usd = {(A,): 3.0, (B,): 1.0, (A, B): 4.0, (A, A): 6.0}
    done: set = {(A,), (B,)}
    r = lazy_mix(list(true), exact=lambda c: true[c] if c in done else None, bound=bound.__getitem__, usd=usd,
                 objective="throughput", available={A: 3, B: 1}, budget_s=60.0,
                 evaluate=lambda c: done.add(c) or true[c])
    assert r.best.throughput_per_s == pytest.approx(34.0) and r.gap == 0.0
    # no time: the answer uses evaluated cells only (3 A + B = 31), its gap certified against bounds (A+A, A+B: 45)
    done2: set = {(A,), (B,)}
    r2 = lazy_mix(list(true), exact=lambda c: true[c] if c in done2 else None, bound=bound.__getitem__, usd=usd,
                  objective="throughput", available={A: 3, B: 1}, budget_s=-1.0, evaluate=lambda c: 0.0)
    assert r2.best.throughput_per_s == pytest.approx(31.0) and r2.gap == pytest.approx(1 - 31 / 45)


@pytest.mark.slow
def test_tiny_fleet_end_to_end(tmp_path) -> None:
    spec = FleetSpec.from_counts({"H100": 2, "L4": 1})
    fp = plan_fleet("llama-tiny", spec, workload=None, budget_s=60.0)
    used = {}
    for c in fp.cells:
        for g in c.gpus:
            used[g] = used.get(g, 0) + c.count
    assert all(used.get(g, 0) + fp.unused.get(g, 0) == n for g, n in spec.gpus)
    assert fp.throughput_per_s == pytest.approx(sum(c.count * c.throughput_per_s for c in fp.cells))
    assert fp.throughput_per_s <= fp.upper_bound_per_s * (1 + 1e-9) and fp.gap == 0.0
    p = tmp_path / "fleet.json"
    fp.save(p)
    assert FleetPlan.load(p) == fp
    new, replan_s = replan_without(fp, "H100")
    assert replan_s > 0 and new.spec.counts == {A: 1, B: 1}
    assert new.throughput_per_s <= fp.throughput_per_s


def test_cli_bad_pool_is_one_line(tmp_path) -> None:
    from tessera.fleet.cli import register

    app = typer.Typer()
    app.command("noop")(lambda: None)
    register(app)
    bad = tmp_path / "pool.toml"
    bad.write_text('[[gpu]]\ntype = "H999"\ncount = 1\n')
    r = CliRunner().invoke(app, ["fleet", "plan", "llama-tiny", "--pool", str(bad)])
    assert isinstance(r.exception, UserError) and "unknown GPU 'H999'" in str(r.exception)
