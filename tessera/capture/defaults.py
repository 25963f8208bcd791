"""Step sizes used when the caller gives none: plain numbers, importable without torch."""

from __future__ import annotations

# Image patches of one 448×448 image (14-pixel patches, 32×32 = 1024).
DEFAULT_IMAGE_PATCHES = 1024
# Tokens (or patches) per step, by phase.
DEFAULT_SEQ = {"prefill": 512, "denoise": 4096, "decode": 1, "encode": DEFAULT_IMAGE_PATCHES}
# Context already cached when the step runs, by phase.
DEFAULT_CONTEXT = {"decode": 2048, "denoise": 512}
