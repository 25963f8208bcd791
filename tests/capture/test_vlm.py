"""Qwen2.5-VL: vision tower FLOPs by hand, invariants and layer numbering per phase, batch determinism,
golden replay, CLI."""

from __future__ import annotations

import json

import pytest
import torch

from tessera.capture import capture_model, capture_program, model_phases, replay
from tessera.capture.vlm import image_grid
from tessera.graph import KernelKind, Role
from tests.conftest import RunCli

# qwen-vl-tiny: 2 vision blocks (0 windowed, 1 full attention) then 2 LM layers -> layers 0-1 and 2-3
SHAPES = {"encode": {"seq": 128}, "prefill": {"seq": 40, "context": 64}, "decode": {"context": 12}}


def _vision_flops(images: int, patches: int, *, hidden: int, inter: int, depth: int, full: int, window: int,
                  out: int) -> int:
    """Hand count of the Qwen2.5-VL vision tower: conv patch embed (1176 = 3·2·14·14 values per patch),
    per block qkv + proj + gate/up/down, attention 4·L²·hidden per segment (windowed blocks: windows of
    ``window`` patches; full blocks: one segment per image), merger MLP over the 2×2-merged tokens."""
    n = images * patches
    linear = 2 * n * (hidden * 3 * hidden + hidden * hidden + 3 * hidden * inter)
    windowed = images * (patches // window) * 4 * window * window * hidden
    whole = images * 4 * patches * patches * hidden
    merger = 2 * (n // 4) * (4 * hidden * 4 * hidden + 4 * hidden * out)
    return 2 * n * 1176 * hidden + depth * linear + (depth - full) * windowed + full * whole + merger


def test_tiny_encode_flops_match_hand_count() -> None:
    g = capture_model("qwen-vl-tiny", "encode", batch=2, seq=128)  # 8×16 patches: 2 windows of 8×8 each
    assert image_grid(128, 2) == (1, 8, 16)
    assert g.flops == _vision_flops(2, 128, hidden=32, inter=64, depth=2, full=1, window=64, out=64)
    assert g.flops == 39_190_528
    attention = [k for k in g.kernels if k.kind is KernelKind.ATTENTION]
    assert [k.layer for k in attention] == [0] * 4 + [1] * 2  # 2 windows × 2 images, then 1 per image


@pytest.mark.parametrize("phase", ["encode", "prefill", "decode"])
def test_invariants_and_layer_numbering(phase: str) -> None:
    assert model_phases("qwen-vl-tiny") == ["encode", "prefill", "decode"]
    g = capture_model("qwen-vl-tiny", phase, batch=2, **SHAPES[phase])
    g.check_invariants()  # acyclic; every read written earlier or input/weight/kv/state
    assert any(b.role is Role.OUTPUT for b in g.buffers)
    layers = {"encode": {0, 1}, "prefill": {0, 1, 2, 3}, "decode": {2, 3}}[phase]
    assert {k.layer for k in g.kernels} - {None} == layers
    for k in g.kernels:
        if k.layer is not None:
            prefix = "model.visual.blocks." if k.layer < 2 else "model.language_model.layers."
            assert k.module.startswith(f"{prefix}{k.layer % 2}")
    if phase == "decode":  # the new token's K/V are written into the cache, then attention reads it
        kv = {b.id for b in g.buffers if b.role is Role.KV}
        assert len(kv) == 4
        for b in kv:
            first_write = min(k.id for k in g.kernels if b in k.writes)
            assert any(k.id > first_write and b in k.reads and k.kind is KernelKind.ATTENTION_DECODE
                       for k in g.kernels)
    if phase == "prefill":  # 40 LM tokens, 16 of them the image's merged patches: K/V of all 40 written
        assert g.shape == {"batch": 2, "seq": 40, "context": 0, "image_patches": 64}
        assert sum(b.bytes for b in g.buffers if b.role is Role.KV) == 2 * 2 * 2 * 2 * 40 * 16 * 2


@pytest.mark.parametrize("phase", ["encode", "prefill", "decode"])
def test_same_kernels_at_batch_2_and_4(phase: str) -> None:
    a = capture_model("qwen-vl-tiny", phase, batch=2, **SHAPES[phase])
    b = capture_model("qwen-vl-tiny", phase, batch=4, **SHAPES[phase])
    seq_a = [(k.name, k.module, k.layer) for k in a.kernels]
    seq_b = [(k.name, k.module, k.layer) for k in b.kernels]
    if phase == "decode":
        assert seq_a == seq_b
        return
    # the vision tower attends per image (full blocks) and per window: one kernel per segment, so twice
    # the images give twice the vision attention kernels; every other kernel is the same
    vis = [[k for k in g.kernels if k.kind is KernelKind.ATTENTION and k.module.startswith("model.visual")]
           for g in (a, b)]
    assert len(vis[1]) == 2 * len(vis[0]) == {"encode": 12, "prefill": 8}[phase]  # prefill image: 1 window
    drop = [{k.id for k in v} for v in vis]
    assert [s for k, s in zip(a.kernels, seq_a, strict=True) if k.id not in drop[0]] == \
        [s for k, s in zip(b.kernels, seq_b, strict=True) if k.id not in drop[1]]


@pytest.mark.parametrize("phase", ["encode", "prefill", "decode"])
def test_replay_is_bit_exact_and_matches_fake_structure(phase: str) -> None:
    cap = capture_program("qwen-vl-tiny", phase, batch=2, **SHAPES[phase])
    out = replay(cap)
    assert len(out) == len(cap.expected) == 1
    assert torch.equal(out[0], cap.expected[0])
    fake = capture_model("qwen-vl-tiny", phase, batch=2, dtype=torch.float32, eager=True, **SHAPES[phase])
    assert [(k.name, k.module) for k in fake.kernels] == [(k.name, k.module) for k in cap.graph.kernels]




def test_cli_trace_7b_encode_json(run_cli: RunCli) -> None:
    code, out, _ = run_cli(["trace", "qwen2.5-vl-7b", "--phase", "encode", "--json"])
    assert code == 0
    s = json.loads(out)
    # Qwen/Qwen2.5-VL-7B-Instruct vision_config: hidden 1280, ffn 3420, depth 32 (4 full-attention blocks),
    # window 112 px = 8×8 patches, out 3584; default image 448×448 = 32×32 patches of 14 px
    assert s["layers"] == 32
    assert s["flops"] == _vision_flops(1, 1024, hidden=1280, inter=3420, depth=32, full=4, window=64, out=3584)
    assert s["kv_bytes"] == 0


@pytest.mark.parametrize(("argv", "needle"), [
    (["--phase", "encode", "--seq", "130"], "image patches=130 must be a multiple of 4"),
    (["--phase", "prefill", "--seq", "10", "--context", "64"], "use --seq >= 19"),
    (["--phase", "denoise"], "valid: decode, encode, prefill"),
])
def test_user_mistakes_are_one_line(argv: list[str], needle: str, run_cli: RunCli) -> None:
    code, _, err = run_cli(["trace", "qwen-vl-tiny", *argv])
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
