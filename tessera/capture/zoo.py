"""The model zoo: configs copied from each model's published config.json, plus tiny variants.

Nothing is downloaded: models are built from these configs with random weights (fake tensors for the
real sizes, real fp32 tensors for the tiny ones).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.capture.liger import LIGER_VARIANTS, variant_config
from tessera.errors import UserError, choices_error

PHASES: dict[str, tuple[str, ...]] = {
    "llm": ("prefill", "decode"),
    "moe": ("prefill", "decode"),
    "ssm": ("prefill", "decode"),
    "dit": ("denoise",),
    "vlm": ("encode", "prefill", "decode"),
}


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    family: str  # llm | moe | ssm | dit | vlm
    config: dict[str, Any] = field(hash=False)  # transformers config kwargs (model_type) or diffusers kwargs
    source: str  # where the numbers come from
    tiny: bool = False

    def __post_init__(self) -> None:
        if self.family not in PHASES:
            raise ValueError(f"model {self.name}: family {self.family!r} not in {sorted(PHASES)}")


_LLAMA3_8B = dict(  # meta-llama/Meta-Llama-3-8B, config.json
    model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5,
    rope_theta=500000.0, tie_word_embeddings=False, hidden_act="silu",
)
_LLAMA3_70B = dict(  # meta-llama/Meta-Llama-3-70B, config.json
    _LLAMA3_8B, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
)
_QWEN25_7B = dict(  # Qwen/Qwen2.5-7B-Instruct, config.json
    model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
    num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rms_norm_eps=1e-6,
    rope_theta=1000000.0, tie_word_embeddings=False, hidden_act="silu",
)
_MIXTRAL = dict(  # mistralai/Mixtral-8x7B-v0.1, config.json
    model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768, rms_norm_eps=1e-5,
    rope_theta=1000000.0, num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False,
)
_MAMBA2 = dict(  # state-spaces/mamba2-2.7b, config.json (mamba_ssm format: d_model 2560, n_layer 64,
    # vocab 50277 padded to a multiple of 16, Mamba2 defaults d_state 128, headdim 64, expand 2, ngroups 1)
    model_type="mamba2", hidden_size=2560, num_hidden_layers=64, vocab_size=50288, state_size=128, head_dim=64,
    expand=2, num_heads=80, n_groups=1, conv_kernel=4, chunk_size=256, tie_word_embeddings=True,
)
_QWEN25_VL = dict(  # Qwen/Qwen2.5-VL-7B-Instruct, config.json (its text fields are top-level there;
    # transformers 5 keeps them in text_config; config.json's vision "in_chans" is transformers' in_channels)
    model_type="qwen2_5_vl",
    text_config=dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, max_position_embeddings=128000, rms_norm_eps=1e-6,
        rope_theta=1000000.0, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
        sliding_window=32768, use_sliding_window=False, max_window_layers=28, hidden_act="silu",
    ),
    vision_config=dict(
        depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
        in_channels=3, hidden_act="silu", tokens_per_second=2,
    ),
    image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
    tie_word_embeddings=False,
)
_FLUX_DEV = dict(  # black-forest-labs/FLUX.1-dev, transformer/config.json
    _class_name="FluxTransformer2DModel", attention_head_dim=128, guidance_embeds=True, in_channels=64,
    joint_attention_dim=4096, num_attention_heads=24, num_layers=19, num_single_layers=38, patch_size=1,
    pooled_projection_dim=768, axes_dims_rope=[16, 56, 56],
)

_TINY_LLM = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, max_position_embeddings=4096)

# 2 vision blocks (block 1 full attention, block 0 windowed) + 2 LM layers; head dim 16 for both, so the
# mrope sections (pairs of rotary dims per t/h/w axis) sum to 8; special token ids moved into the vocab.
_TINY_VL = dict(
    text_config=dict(_TINY_LLM, rms_norm_eps=1e-6, rope_theta=1000000.0,
                     rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
    vision_config=dict(_QWEN25_VL["vision_config"], depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                       out_hidden_size=64, fullatt_block_indexes=[1]),
    image_token_id=254, video_token_id=255, vision_start_token_id=252, vision_end_token_id=253,
)

SPECS: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec(name="llama-3-8b", family="llm", config=_LLAMA3_8B, source="meta-llama/Meta-Llama-3-8B config.json"),
    ModelSpec(name="llama-3-70b", family="llm", config=_LLAMA3_70B,
              source="meta-llama/Meta-Llama-3-70B config.json"),
    ModelSpec(name="qwen2.5-7b", family="llm", config=_QWEN25_7B, source="Qwen/Qwen2.5-7B-Instruct config.json"),
    ModelSpec(name="mixtral-8x7b", family="moe", config=_MIXTRAL, source="mistralai/Mixtral-8x7B-v0.1 config.json"),
    ModelSpec(name="mamba2-2.7b", family="ssm", config=_MAMBA2, source="state-spaces/mamba2-2.7b config.json"),
    ModelSpec(name="qwen2.5-vl-7b", family="vlm", config=_QWEN25_VL,
              source="Qwen/Qwen2.5-VL-7B-Instruct config.json"),
    ModelSpec(name="flux-dev", family="dit", config=_FLUX_DEV,
              source="black-forest-labs/FLUX.1-dev transformer/config.json"),
    ModelSpec(name="llama-tiny", family="llm", tiny=True, source="llama-3 shape, shrunk",
              config=dict(_LLAMA3_8B, **_TINY_LLM)),
    # wide enough that a batch-1 step's GEMMs, not per-kernel dispatch, dominate on a CPU core (the runtime's
    # asynchronous-schedule check needs work that scales with the micro-batch); still seconds to capture
    ModelSpec(name="llama-wide", family="llm", tiny=True, source="llama-3 shape, hidden 1024, 4 layers",
              config=dict(_LLAMA3_8B, **_TINY_LLM | dict(hidden_size=1024, intermediate_size=2816,
                                                        num_attention_heads=16, num_key_value_heads=4,
                                                        num_hidden_layers=4))),
    ModelSpec(name="qwen-tiny", family="llm", tiny=True, source="qwen2.5 shape, shrunk",
              config=dict(_QWEN25_7B, **_TINY_LLM)),
    ModelSpec(name="moe-tiny", family="moe", tiny=True, source="mixtral shape, shrunk",
              config=dict(_MIXTRAL, **_TINY_LLM, num_local_experts=4)),
    ModelSpec(name="mamba2-tiny", family="ssm", tiny=True, source="mamba2 shape, shrunk",
              config=dict(_MAMBA2, hidden_size=64, num_hidden_layers=2, vocab_size=256, state_size=16,
                          head_dim=16, num_heads=8, chunk_size=8)),
    ModelSpec(name="qwen-vl-tiny", family="vlm", tiny=True, source="qwen2.5-vl shape, shrunk",
              config=dict(_QWEN25_VL, **_TINY_VL)),
    ModelSpec(name="dit-tiny", family="dit", tiny=True, source="flux shape, shrunk",
              config=dict(_FLUX_DEV, attention_head_dim=16, in_channels=16, joint_attention_dim=32,
                          num_attention_heads=2, num_layers=1, num_single_layers=1, pooled_projection_dim=16,
                          axes_dims_rope=[4, 6, 6])),
)}

# Liger-Kernel variants (Triton RMSNorm, SwiGLU, rotary; tessera.capture.liger): same config, marked.
SPECS.update({name: ModelSpec(name=name, family=SPECS[base].family, tiny=SPECS[base].tiny,
                              config=variant_config(SPECS[base].config),
                              source=SPECS[base].source + " + Liger-Kernel Triton kernels")
              for name, base in LIGER_VARIANTS.items()})


def model_names() -> list[str]:
    return list(SPECS)


def resolve(name: str) -> ModelSpec:
    """A zoo name, or a local config.json (or a directory holding one) of any architecture transformers
    or diffusers builds from a config (``anymodel``)."""
    if name in SPECS:
        return SPECS[name]
    path = Path(name)
    if not (name.endswith(".json") or path.exists()):
        raise choices_error("model", name, [*SPECS, "<path to config.json or a model directory>"])
    from tessera.capture import anymodel

    cfg, file = anymodel.load_config(name)
    family = anymodel.family_of(cfg, name)
    stem = file.parent.name if file.stem == "config" else file.stem.removesuffix("_config")
    return ModelSpec(name=stem or "config", family=family, config=cfg, source=str(file))


def model_phases(name: str) -> list[str]:
    return list(PHASES[resolve(name).family])


def image_patches(name: str, image_tokens: int) -> int:
    """Patches a vision-language model's vision tower encodes for an image of ``image_tokens`` LM tokens:
    one LM token per merge × merge patches (Qwen2.5-VL: 2×2, its vision_config.spatial_merge_size)."""
    spec = resolve(name)
    if spec.family != "vlm":
        raise UserError(f"{name} has no vision tower (family {spec.family}); image tokens apply to a "
                        f"vision-language model, e.g. {', '.join(n for n, s in SPECS.items() if s.family == 'vlm')}")
    merge = spec.config.get("vision_config", {}).get("spatial_merge_size", 2)
    return image_tokens * merge * merge
