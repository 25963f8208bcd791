"""Qwen2.5-VL steps: the vision tower alone (encode), vision tower + LM (prefill), LM decode.

Fake tensors cannot hand data to Python, and the vision tower turns grid metadata into Python numbers:
window and position indices come from ``grid_thw.tolist()`` loops, and the sdpa path splits the packed
sequence with ``(cu_seqlens[1:] - cu_seqlens[:-1]).tolist()``. So that metadata (a few KB: token ids,
grid sizes, window index, cu_seqlens, vision and mrope position ids) is computed with transformers' own
helpers on real CPU tensors outside the fake mode and passed in through the tower's precomputed kwargs,
while pixels, weights and activations stay fake. ``cu_seqlens`` / ``cu_window_seqlens`` go in as numpy
arrays: host-side split sizes, which is what the sdpa path uses them for (a real tensor would be turned
fake by the first op on it, and ``.tolist()`` of a fake tensor is a DataDependentOutputException).
"""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

import torch
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily

from tessera.capture.defaults import DEFAULT_IMAGE_PATCHES
from tessera.capture.steps import Step, static_cache
from tessera.errors import UserError
from tessera.graph import Role

# A 448×448 image is 32×32 patches of 14 px (Qwen2.5-VL's patch_size), 256 LM tokens after the 2×2 merge.


def image_grid(patches: int, merge: int) -> tuple[int, int, int]:
    """(t, h, w) patch grid of a still image with ``patches`` patches: as square as the count allows."""
    unit = merge * merge
    if patches % unit:
        raise UserError(f"image patches={patches} must be a multiple of {unit} (the {merge}×{merge} patch merge); "
                        f"e.g. {DEFAULT_IMAGE_PATCHES} = a 448×448 image")
    cells = patches // unit
    rows = max(d for d in range(1, int(cells ** 0.5) + 1) if cells % d == 0)
    return 1, rows * merge, cells // rows * merge


def _vision_inputs(model: nn.Module, batch: int, patches: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``batch`` images of ``patches`` patches: pixel patches and metadata in the capture's mode, and the
    real (t, h, w) grid of each image."""
    from transformers.vision_utils import (
        get_vision_attention_seqlens,
        get_vision_position_ids,
        get_vision_window_index,
    )

    visual = model.model.visual
    vc = visual.config
    grid_row = image_grid(patches, vc.spatial_merge_size)
    # one flattened patch = channels × temporal_patch × patch² values (1176 for Qwen2.5-VL)
    pixels = torch.randn(batch * patches, vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2)
    with unset_fake_temporarily():
        grid = torch.tensor([grid_row] * batch)
        cu_seqlens, _ = get_vision_attention_seqlens(grid, vc)
        window_index, cu_window = get_vision_window_index(grid, spatial_merge_size=vc.spatial_merge_size,
                                                          window_size=vc.window_size, patch_size=vc.patch_size)
        meta = dict(position_ids=get_vision_position_ids(grid, vc.spatial_merge_size), window_index=window_index,
                    cu_seqlens=cu_seqlens.numpy(), cu_window_seqlens=cu_window.numpy())
    return pixels, grid, _in_mode(meta)


def _in_mode(tree: dict[str, Any]) -> dict[str, Any]:
    """Real metadata tensors as tensors of the capture's mode (fake under fake tensors): the fake mode
    would convert a real one anew at each use, so its views would not look like views of one buffer."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in tree.items()}


def _tensor_buffers(prefix: str, tensors: dict[str, Any]) -> list[tuple[torch.Tensor, Role, str]]:
    return [(t, Role.INPUT, prefix + k) for k, t in tensors.items() if isinstance(t, torch.Tensor)]


def encode_step(model: nn.Module, batch: int, patches: int) -> Step:
    """The vision tower on ``batch`` images of ``patches`` patches; output: the merged image embeddings."""
    pixels, grid, meta = _vision_inputs(model, batch, patches)
    grid = grid.clone()
    step = Step(run=lambda: (model.model.visual(pixels, grid_thw=grid, **meta).pooler_output,),
                shape={"batch": batch, "seq": patches, "context": 0})
    step.buffers = [(pixels, Role.INPUT, "pixel_values"), (grid, Role.INPUT, "image_grid_thw"),
                    *_tensor_buffers("vision.", meta)]
    return step


def prefill_step(model: nn.Module, batch: int, seq: int, patches: int, real: bool) -> Step:
    """``batch`` prompts of ``seq`` LM tokens, each holding one image of ``patches`` patches: the vision
    tower, then the LM over [vision_start, image tokens, vision_end, text…] writing a static cache."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    cfg = model.config
    merge = cfg.vision_config.spatial_merge_size
    image_tokens = patches // (merge * merge)
    if seq < image_tokens + 3:
        raise UserError(f"seq={seq} LM tokens cannot hold an image of {patches} patches ({image_tokens} tokens) "
                        f"plus vision start/end and one text token; use --seq >= {image_tokens + 3}")
    pixels, grid, meta = _vision_inputs(model, batch, patches)
    text_vocab = min(cfg.vision_start_token_id, cfg.image_token_id, cfg.video_token_id)  # no stray specials
    with unset_fake_temporarily():
        ids = torch.randint(0, text_vocab, (batch, seq))
        ids[:, 0] = cfg.vision_start_token_id
        ids[:, 1:1 + image_tokens] = cfg.image_token_id
        ids[:, 1 + image_tokens] = cfg.vision_end_token_id
        token_type = (ids == cfg.image_token_id).int()
        pos, _ = model.model.get_rope_index(ids, token_type, image_grid_thw=grid)  # (3, batch, seq) mrope
    ids, pos, grid = ids.clone(), pos.clone(), grid.clone()
    step = Step(run=lambda: (), shape={"batch": batch, "seq": seq, "context": 0, "image_patches": patches})
    cache = static_cache(model, step, batch=batch, past=0, length=seq, real=real)

    def run() -> tuple[torch.Tensor, ...]:
        embeds = model.model.visual(pixels, grid_thw=grid, **meta).pooler_output
        # what get_image_features returns: one tensor of embeddings per image (views, not kernels)
        image = BaseModelOutputWithPooling(pooler_output=torch.split(embeds, image_tokens))
        # The placeholder check compares a device-side count with the features (`.item()` under fake
        # tensors); the ids are built above with exactly image_tokens placeholders per prompt, so turn it
        # off with transformers' own switch. The mask and count kernels still run.
        with mock.patch.dict(os.environ, {"TRANSFORMERS_DISABLE_TORCH_CHECK": "1"}):
            return (model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1,
                          mm_encoder_outputs={"image": image}).logits,)

    step.run = run
    step.buffers += [(pixels, Role.INPUT, "pixel_values"), (grid, Role.INPUT, "image_grid_thw"),
                     *_tensor_buffers("vision.", meta), (ids, Role.INPUT, "input_ids"), (pos, Role.INPUT, "position_ids")]
    return step
