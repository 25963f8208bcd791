"""Hand-built plans whose step times are closed-form, so expected metrics can be worked out by hand."""

from __future__ import annotations

import pytest

from tessera.sim.handplan import PhaseCost, hand_plan

# prefill: 10 ms + 20 µs/token, sampled 128..16384 tokens at prompt length 128
PREFILL = PhaseCost(fixed_s=0.01, per_token_s=2e-5, tokens=(128, 16384), contexts=(128,))
# decode: 20 ms + 100 µs/sequence, sampled batch 1..128, flat in context
DECODE = PhaseCost(fixed_s=0.02, per_token_s=1e-4, tokens=(1, 64, 128), contexts=(0,))


def p_s(tokens: float) -> float:
    return 0.01 + 2e-5 * tokens


def d_s(batch: float) -> float:
    return 0.02 + 1e-4 * batch


@pytest.fixture
def plan():
    return hand_plan(phases={"prefill": PREFILL, "decode": DECODE})


@pytest.fixture
def split_plan():
    """Prefill on device 0 only, decode on device 1 only: two lanes running concurrently."""
    pf = PhaseCost(fixed_s=0.01, per_token_s=2e-5, tokens=(128, 16384), contexts=(128,), busy_share=(1.0, 0.0))
    dc = PhaseCost(fixed_s=0.02, per_token_s=1e-4, tokens=(1, 64, 128), contexts=(0,), busy_share=(0.0, 1.0))
    return hand_plan(phases={"prefill": pf, "decode": dc}, gpus=("H100-SXM", "L40S"), strategy="prefill_decode")


@pytest.fixture
def shared_pair_plan():
    pf = PhaseCost(fixed_s=0.01, per_token_s=2e-5, tokens=(128, 16384), contexts=(128,), busy_share=(1.0, 0.5))
    dc = PhaseCost(fixed_s=0.02, per_token_s=1e-4, tokens=(1, 64, 128), contexts=(0,), busy_share=(0.5, 1.0))
    return hand_plan(phases={"prefill": pf, "decode": dc}, gpus=("H100-SXM", "L40S"))
