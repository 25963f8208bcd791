"""`make demo`: the main job on built-in defaults (extended as stages land)."""

from __future__ import annotations

from tessera.cli import main

if __name__ == "__main__":
    main(["gpus"])
