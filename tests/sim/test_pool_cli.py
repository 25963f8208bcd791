"""`tessera simulate` (and `tessera run`) take either plan file kind, told apart by content: one cell's
Plan or a PoolPlan of different cells; anything else is one line, exit 2."""

from __future__ import annotations

import json

from tessera.contracts.plan import PoolCell, PoolPlan
from tessera.contracts.provenance import fingerprint
from tessera.sim import LengthSpec, WorkloadSpec, simulate
from tessera.sim.handplan import hand_plan

from .conftest import DECODE, PREFILL


def _pool() -> PoolPlan:
    fast = hand_plan(phases={"prefill": PREFILL, "decode": DECODE}, usd_per_hour=3.0)
    slow = hand_plan(phases={"prefill": PREFILL, "decode": DECODE}, gpus=("L40S",), usd_per_hour=1.0)
    return PoolPlan(cells=(PoolCell(plan=fast, count=2), PoolCell(plan=slow, count=1)))


def _simulate_json(run_cli, path) -> dict:
    code, out, err = run_cli(["simulate", str(path), "--requests", "60", "--prompt", "128", "--output", "8",
                              "--json"])
    assert code == 0, err
    return json.loads(out)


def test_simulate_takes_both_file_kinds(tmp_path, run_cli) -> None:
    pool = _pool()
    pool.save(tmp_path / "pool.json")
    pool.lead.save(tmp_path / "plan.json")
    got = _simulate_json(run_cli, tmp_path / "pool.json")
    assert got["completed"] == 60 and got["lost"] == 0
    wl = WorkloadSpec(kind="offline", requests=60, prompt=LengthSpec(lo=128, hi=128), output=LengthSpec(lo=8, hi=8))
    want = simulate(pool, wl).to_json()
    got.pop("sim_wall_s"), want.pop("sim_wall_s")
    prov = got.pop("provenance")  # what was simulated: this pool, by its fingerprint, offline, seed 0
    assert got == want
    assert (prov["model"], prov["plan"], prov["workload"], prov["rate_per_s"], prov["seed"]) == \
        (pool.model, fingerprint(pool), "offline", None, 0)
    assert (prov["prompt"], prov["output"], prov["output_per_request"]) == ("128", "8", 8.0)
    one = _simulate_json(run_cli, tmp_path / "plan.json")
    assert one["completed"] == 60 and one["lost"] == 0


def test_simulate_names_the_pool_in_its_table(tmp_path, run_cli) -> None:
    _pool().save(tmp_path / "pool.json")
    code, out, _ = run_cli(["simulate", str(tmp_path / "pool.json"), "--requests", "30", "--output", "8"])
    assert code == 0 and "pool of 2 different cells" in out


def test_a_file_of_neither_kind_is_one_line_exit_2(tmp_path, run_cli) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": "llama-tiny", "gpus": ["H100"]}))
    code, out, err = run_cli(["simulate", str(bad)])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and out == "" and len(lines) == 1
    assert "bad.json" in lines[0] and "neither a plan" in lines[0] and "Traceback" not in err


def test_adaptive_on_a_pool_is_one_line_exit_2(tmp_path, run_cli) -> None:
    pool = _pool()
    pool.save(tmp_path / "pool.json")
    pool.lead.save(tmp_path / "lat.json")
    code, _, err = run_cli(["simulate", str(tmp_path / "pool.json"), "--adaptive", "--latency-plan",
                            str(tmp_path / "lat.json")])
    assert code == 2 and "pool of 2 different cells" in err and len(err.strip().splitlines()) == 1


def test_run_refuses_a_pool_in_one_line(tmp_path, run_cli) -> None:
    _pool().save(tmp_path / "pool.json")
    code, _, err = run_cli(["run", str(tmp_path / "pool.json")])
    assert code == 2 and "pool of 2 different cells" in err and len(err.strip().splitlines()) == 1
