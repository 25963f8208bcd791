"""`tessera run` checks memory before capturing anything real for the MoE family too: Mixtral-8x7B's fp32
weights (46.7 B parameters, 186.8 GB) once per captured step cannot fit a machine of tens of GB."""

from __future__ import annotations


def test_moe_run_refused_before_capture(run_cli, monkeypatch):
    monkeypatch.setattr("tessera.runtime.budget.available_bytes", lambda: 32 * 10**9)
    code, _, err = run_cli(["run", "mixtral-8x7b", "--devices", "cpu,cpu"])
    assert code == 2 and "a real run of mixtral-8x7b needs at least" in err, err
    assert "32.0 GB is available" in err and len(err.strip().splitlines()) == 1
