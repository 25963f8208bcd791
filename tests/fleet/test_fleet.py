"""Fleet planning: pool file, candidate cells, the pair bound's pieces against hand-worked values and an
independent LP, the integer program against hand-worked optima, the lazy search's certificate, and one real
fleet on a tiny model (plan_serving included) with a JSON round trip, the bound checked against every planned
pair, and a re-plan after a loss."""

from __future__ import annotations

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from tessera.errors import UserError
from tessera.fleet import FleetPlan, FleetSpec, plan_fleet, replan_without
from tessera.fleet.advise import Advice, MixChoice, parse_have
from tessera.fleet.cells import activation_deps, balance_two, candidate_cells, is_group, shortest_latency
from tessera.fleet.fleet import cell_planner, fleet_config
from tessera.fleet.mix import lazy_mix, solve_mix, verify_mix
from tessera.graph import Buffer, Kernel, KernelKind, Role, build_graph
from tessera.plan import PlannerConfig, Slo
from tessera.plan.solver.highs import Model

A, B = "H100-SXM", "L4"


def test_pool_file_parses_and_validates() -> None:
    pool = '[[gpu]]\ntype = "H100"\ncount = 4\n[[gpu]]\ntype = "L4"\ncount = 2\n'
    s = FleetSpec.parse('link = "PCIe4"\n' + pool)
    assert s.counts == {A: 4, B: 2} and s.total == 6 and s.link == "pcie4"
    # the L4 is a PCIe Gen4 card: an H100 + L4 cell cannot have PCIe 5 or NVLink; default: each cell's best
    with pytest.raises(UserError, match=r"link pcie5 cannot join H100-SXM \+ L4: L4 is a PCIe Gen4 card; every "
                                        r"pair of this pool can have: auto \(each cell its best\), .*pcie4"):
        FleetSpec.parse('link = "pcie5"\n' + pool)
    assert FleetSpec.parse('[[gpu]]\ntype = "H100"\ncount = 4\n').link == "auto"
    assert FleetSpec.parse('link = "nvlink4"\n[[gpu]]\ntype = "H100"\ncount = 4\n').link == "nvlink4"
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
    # 4 H100: alone, a TP=4 group, a same-type pair; 1 L4: alone; the mixed pair. No TP=8 (only four H100).
    assert candidate_cells({B: 1, A: 4}) == [(A,), (B,), (A, A), (A, B), (A, A, A, A)]
    assert candidate_cells({A: 8}, max_gpus=4) == [(A,), (A, A), (A,) * 4]
    assert candidate_cells({A: 8})[-1] == (A,) * 8
    assert [is_group(c) for c in [(A,), (A, A), (A,) * 4, (A, B)]] == [True, False, True, False]


def test_balance_two_by_hand() -> None:
    # chain3's kernels on (H100, L40S): a (2, 4), b (3, 3), c (4, 2). Fractionally: a on H100 (2), c on L40S
    # (2), b split evenly so both carry 3.5; nothing better exists since a+b+c on the faster side is 7.
    assert balance_two(np.array([[2.0, 4.0], [3.0, 3.0], [4.0, 2.0]])) == pytest.approx(3.5)
    # one device has nothing to do for free: every kernel costs 0 on b
    assert balance_two(np.array([[1.0, 0.0], [2.0, 0.0]])) == 0.0
    assert balance_two(np.array([[5.0, 5.0]])) == pytest.approx(2.5)  # one kernel split in half


def _lp_balance(t: np.ndarray) -> float:
    """The same relaxation written as an LP for HiGHS: min C, Σ t_a·y ≤ C, Σ t_b·(1 − y) ≤ C."""
    m = Model("balance")
    c = m.var("C", cost=1.0)
    ys = [m.var(f"y{k}", ub=1.0) for k in range(len(t))]
    m.row("a", {c: -1.0, **{y: float(t[k, 0]) for k, y in enumerate(ys)}}, ub=0.0)
    m.row("b", {c: -1.0, **{y: -float(t[k, 1]) for k, y in enumerate(ys)}}, ub=-float(t[:, 1].sum()))
    return m.solve(relax=True).objective


def test_balance_two_matches_an_lp() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        t = rng.uniform(0.0, 5.0, size=(int(rng.integers(1, 30)), 2))
        assert balance_two(t) == pytest.approx(_lp_balance(t), rel=1e-7, abs=1e-9)


def _chain3():
    """x -> a -> b -> c, one activation between each, one weight per kernel, c also writes a KV buffer a
    reads (resident: no wait)."""
    bufs = [Buffer(id=0, name="x", bytes=8, role=Role.INPUT), Buffer(id=7, name="kv", bytes=8, role=Role.KV)]
    bufs += [Buffer(id=1 + i, name=n, bytes=8, role=Role.ACTIVATION) for i, n in enumerate(("va", "vb", "vc"))]
    bufs += [Buffer(id=4 + i, name=n, bytes=8, role=Role.WEIGHT) for i, n in enumerate(("wa", "wb", "wc"))]
    io = [((0, 4, 7), (1,)), ((1, 5), (2,)), ((2, 6), (3, 7))]
    ks = [Kernel(id=i, name=n, kind=KernelKind.GEMM, flops=1, bytes_read=1, bytes_written=1, reads=r, writes=w,
                 layer=None) for i, (n, (r, w)) in enumerate(zip("abc", io, strict=True))]
    return build_graph(model="chain3", phase="decode", shape={"batch": 1}, kernels=ks,
                       buffers=sorted(bufs, key=lambda b: b.id))


def test_shortest_latency_on_chain3() -> None:
    # x -> a -> b -> c: each kernel waits for the one that wrote the activation it reads; weights and KV wait
    # for nothing. At the faster device's times (2, 3, 2) the chain takes 7 s.
    deps = activation_deps(_chain3())
    assert deps == [(), (0,), (1,)]
    assert shortest_latency(deps, np.array([2.0, 3.0, 2.0])) == pytest.approx(7.0)
    assert shortest_latency([(), (), (0, 1)], np.array([1.0, 4.0, 1.0])) == pytest.approx(5.0)  # a fork


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
    cfg = PlannerConfig(slo=Slo(ttft_s=2.0, tpot_s=0.05), batch_cap=64)
    fp = plan_fleet("llama-tiny", spec, cfg, budget_s=120.0)
    used: dict[str, int] = {}
    for c in fp.cells:
        for g in c.gpus:
            used[g] = used.get(g, 0) + c.count
    assert all(used.get(g, 0) + fp.unused.get(g, 0) == n for g, n in spec.gpus)
    assert fp.goodput_per_s == pytest.approx(sum(c.count * c.goodput_per_s for c in fp.cells))
    assert fp.goodput_per_s <= fp.plans.throughput_per_s * (1 + 1e-9)  # goodput within the plans' capacity
    assert fp.goodput_per_s <= fp.upper_bound_per_s * (1 + 1e-9) and fp.gap == 0.0
    # the bound is one: the mixed pair (bounded during the search, maybe never planned) planned now has no
    # strategy above it
    cp = cell_planner("llama-tiny", fleet_config(cfg, link=spec.link))
    bound = cp.upper_bound((A, B))
    every = cp.evaluate((A, B)).strategy_goodput
    assert len(every) == 5 and 0 < max(every.values()) <= bound * (1 + 1e-9), (every, bound)
    p = tmp_path / "fleet.json"
    fp.save(p)
    assert FleetPlan.load(p) == fp
    assert fp.config == fleet_config(cfg, link=spec.link)
    new, replan_s = replan_without(fp, "H100")
    assert replan_s > 0 and new.spec.counts == {A: 1, B: 1}
    assert new.goodput_per_s <= fp.goodput_per_s


def test_parse_have_resolves_aliases_and_sums() -> None:
    """`advise --have`: aliases become catalog names, a type named twice is summed, a bare type counts one."""
    assert parse_have("H100:4,L40S:2") == {A: 4, "L40S": 2}
    assert parse_have("H100:1, H100-SXM:2,L4") == {A: 3, B: 1}
    assert parse_have(None) == {} and parse_have(" , ") == {}
    for bad in ("H100:x", "H100:0", "L4:-1"):
        with pytest.raises(UserError, match=f"--have '{bad}' is not TYPE:COUNT with a count >= 1"):
            parse_have(bad)
    with pytest.raises(UserError, match="H999"):
        parse_have("H999:1")


def test_advice_without_a_pool_writes_nothing(tmp_path) -> None:
    nothing = MixChoice(group="mix", counts=(), chosen=(), throughput_per_s=0.0, usd_per_hour=0.0, gap=0.0)
    a = Advice(model="llama-tiny", budget_usd_per_hour=1.0, config=PlannerConfig(), kept_types=(), pruned=(),
               mix=nothing, homogeneous=None, prefill_decode=None)
    with pytest.raises(UserError, match="rents nothing that serves it: no plan to write"):
        a.save(tmp_path / "advice.json")
    assert not (tmp_path / "advice.json").exists()


def test_cli_bad_pool_is_one_line(tmp_path) -> None:
    from tessera.cli.fleet import register

    app = typer.Typer()
    app.command("noop")(lambda: None)
    register(app)
    bad = tmp_path / "pool.toml"
    bad.write_text('[[gpu]]\ntype = "H999"\ncount = 1\n')
    r = CliRunner().invoke(app, ["fleet", "plan", "llama-tiny", "--pool", str(bad)])
    assert isinstance(r.exception, UserError) and "unknown GPU 'H999'" in str(r.exception)


def test_planner_config_reads_back_what_it_wrote() -> None:
    """One serializer: the JSON of a config with every default changed reads back equal, with the SLO and
    traffic as the objects a fleet or advice file shows."""
    import json

    from tessera.plan import Traffic

    cfg = PlannerConfig(traffic=Traffic(prompt=512, output=64), slo=Slo(ttft_s=1.0, tpot_s=0.05), batch_cap=32,
                        microbatches=(1, 2), budgets=(1024,), link="nvlink4")
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["slo"] == {"ttft_s": 1.0, "tpot_s": 0.05, "image_s": 60.0, "target": 0.9}
    assert d["traffic"] == {"prompt": 512, "output": 64, "steps": 28, "image_tokens": 0}
    assert d["microbatches"] == [1, 2] and d["budgets"] == [1024]
    assert PlannerConfig.from_dict(d) == cfg
