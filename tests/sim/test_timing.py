import pytest

from tessera.errors import UserError
from tessera.sim.handplan import PhaseCost, hand_plan
from tessera.sim.timing import StepTable, lanes, phase_devices

COST = PhaseCost(fixed_s=0.02, per_token_s=1e-4, per_token_context_s=1e-8, tokens=(1, 64, 128), contexts=(0, 1024))


def table():
    return StepTable.build(hand_plan(phases={"decode": COST}), "decode")


def test_bilinear_cost_is_reproduced_exactly_between_samples():
    t = table()
    for tok, ctx in ((1, 0), (32, 512), (100, 1000), (128, 1024), (64, 300)):
        assert t.time(tok, ctx)[0] == pytest.approx(COST.step_s(tok, ctx), rel=1e-12)


def test_clamp_below_and_linear_extrapolation_above():
    t = table()
    assert t.time(0.5, -5)[0] == pytest.approx(COST.step_s(1, 0))  # held at the smallest sample
    # above the range: the last segment's slope continues (affine cost -> exact)
    assert t.time(256, 0)[0] == pytest.approx(COST.step_s(256, 0))
    assert t.time(128, 2048)[0] == pytest.approx(COST.step_s(128, 2048))


def test_weights_sum_to_one_and_busy_follows_weights():
    t = table()
    _, w = t.time(100, 700)
    assert sum(wi for _, wi in w) == pytest.approx(1.0)
    busy = sum(wi * t.busy_s[i, 0] for i, wi in w)
    assert busy == pytest.approx(COST.step_s(100, 700))


def test_falling_extrapolation_is_clamped():
    c = PhaseCost(fixed_s=0.02, per_token_s=-1e-5, tokens=(1, 64), contexts=(0,))
    t = StepTable.build(hand_plan(phases={"decode": c}), "decode")
    assert t.time(1000, 0)[0] == pytest.approx(c.step_s(64, 0))


def test_lanes_split_disjoint_phases_and_join_shared(split_plan, shared_pair_plan):
    assert phase_devices(split_plan, "prefill") == {0}
    assert phase_devices(split_plan, "decode") == {1}
    assert sorted(map(sorted, lanes(split_plan, ["prefill", "decode"]))) == [["decode"], ["prefill"]]
    assert lanes(shared_pair_plan, ["prefill", "decode"]) == [["prefill", "decode"]]


def test_bad_point_is_a_user_error():
    bad = PhaseCost(fixed_s=0.0, per_token_s=0.0, tokens=(1,), contexts=(0,))
    with pytest.raises(UserError, match="step_s=0"):
        StepTable.build(hand_plan(phases={"decode": bad}), "decode")
