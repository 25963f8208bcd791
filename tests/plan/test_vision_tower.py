"""A VLM's vision tower in the serving iteration: the tower's capture run on the images of the prompts an
iteration starts, sharing the model's weights by name, feeding the language model's first kernel."""

from __future__ import annotations

import pytest

from tessera.errors import UserError
from tessera.graph import Role
from tessera.plan.model.serving import Traffic, steady_shape
from tessera.plan.model.shapes import IterShape, iteration_graph

# qwen-vl-tiny: 16 LM tokens of an image = 64 patches (Qwen2.5-VL merges 2×2 patches into one token)
TOKENS, PATCHES = 16, 64


@pytest.fixture(scope="module")
def captures():
    from tessera.capture import capture_model

    base = capture_model("qwen-vl-tiny", "decode", batch=8, context=16)
    one = capture_model("qwen-vl-tiny", "encode", batch=1, seq=PATCHES)
    two = capture_model("qwen-vl-tiny", "encode", batch=2, seq=PATCHES)
    return base, one, two


def test_image_patches_from_the_config() -> None:
    from tessera.capture import image_patches

    assert image_patches("qwen2.5-vl-7b", 391) == 1564  # 23×17 tokens, 46×34 patches of 14 px
    with pytest.raises(UserError, match="no vision tower.*qwen2.5-vl-7b"):
        image_patches("llama-3-8b", 16)


def test_encoded_images_per_iteration_by_hand() -> None:
    # B = 64, m = 2, P = 400, O = 16: C = 64·400/16 = 1600 → c = 800 per micro-batch = 2 prompts started
    s = steady_shape(64, 2, Traffic(prompt=400, output=16, image_tokens=391))
    assert s.chunk == 800 and s.encode_images == pytest.approx(2.0)
    assert steady_shape(64, 2, Traffic(prompt=400, output=16)).encode_images == 0.0
    with pytest.raises(UserError, match="image tokens=500"):
        Traffic(prompt=400, output=16, image_tokens=500)


def test_tower_at_two_images_is_a_direct_two_image_capture(captures) -> None:
    """Rescaled from a one-image capture to 2 images: the tower's FLOPs equal a direct capture of 2
    images; weights are the LM graph's own buffers (counted once); the image embeddings are read by the
    LM's first kernel."""
    base, one, two = captures
    shape = IterShape(decode=4, context=32, chunk=2 * 40, chunk_len=40, kv_tokens=4 * 48, encode_images=2.0)
    lm = iteration_graph(base, IterShape(decode=4, context=32, chunk=80, chunk_len=40, kv_tokens=192))
    g = iteration_graph(base, shape, one)
    n_tower = len(g.kernels) - len(lm.kernels)
    assert n_tower == len(one.kernels)
    assert sum(k.flops for k in g.kernels[:n_tower]) == sum(k.flops for k in two.kernels)
    assert sum(k.flops for k in g.kernels[n_tower:]) == sum(k.flops for k in lm.kernels)
    weights = [b for b in g.buffers if b.role == Role.WEIGHT]
    assert len(weights) == len([b for b in lm.buffers if b.role == Role.WEIGHT])  # no weight listed twice
    out = [b for b in one.buffers if b.role == Role.OUTPUT]
    assert len(out) == 1
    first_lm = g.kernels[n_tower]
    emb = [g.buffers[b] for b in first_lm.reads if g.buffers[b].name == out[0].name]
    assert emb and emb[0].role == Role.ACTIVATION and emb[0].bytes == 2 * out[0].bytes


def test_splitting_tower_and_lm_pays_the_embeddings_transfer(captures) -> None:
    """Tower on device 0, LM on device 1: the link carries the image embeddings (and nothing else
    crosses); all on one device: no transfer."""
    from tessera.plan.solver.problem import default_cost
    from tessera.plan.solver.verify import evaluate

    from .helpers import POOL

    cost = default_cost()

    base, one, _ = captures
    g = iteration_graph(base, IterShape(decode=4, context=32, chunk=80, chunk_len=40, kv_tokens=192,
                                        encode_images=2.0), one)
    n_tower = len(one.kernels)
    split = (0,) * n_tower + (1,) * (len(g.kernels) - n_tower)
    emb = next(b for b in g.buffers if b.name == next(x.name for x in one.buffers if x.role == Role.OUTPUT))
    ev = evaluate(g, split, POOL.gpus, POOL.link, cost)
    assert ev.link_busy_s[0, 1] == pytest.approx(cost.transfer_time_s(emb.bytes, POOL.link))
    assert evaluate(g, (0,) * len(g.kernels), POOL.gpus, POOL.link, cost).link_busy_s[0, 1] == 0.0


def test_fewer_images_than_captured_scale_the_whole_tower(captures) -> None:
    """Half an image per iteration (one every second iteration): every byte the tower reads, weights
    included, is halved, as are its FLOPs."""
    base, one, _ = captures
    g = iteration_graph(base, IterShape(decode=4, context=32, chunk=20, chunk_len=40, prefix=10, kv_tokens=192,
                                        encode_images=0.5), one)
    for k, t in zip(g.kernels, one.kernels, strict=False):
        assert k.flops == int(t.flops * 0.5)
        assert k.bytes_read == int(t.bytes_read * 0.5)


def test_plan_refuses_image_tokens_on_a_text_model() -> None:
    from tessera.plan.search import PlannerConfig, plan_serving

    cfg = PlannerConfig(traffic=Traffic(prompt=64, output=8, image_tokens=16))
    with pytest.raises(UserError, match="no vision tower"):
        plan_serving("llama-tiny", "H100,L40S", cfg)
