"""The optional C module (`_fastscan.c`, built by setup.py): the fast path's line scanner and the first
fixpoint pass, each identical in results to the Python it replaces (tests/ptx/test_ptx_native.py)."""

from __future__ import annotations

import os
from types import ModuleType


def load(layout_attr: str, expected: tuple[object, ...]) -> ModuleType | None:
    """The module when it was built, TESSERA_PTX_NATIVE is not "0" (the tests run both ways), and its
    constants ``layout_attr`` equal the caller's ``expected`` (a C module left from another version of
    the Python is ignored rather than trusted)."""
    if os.environ.get("TESSERA_PTX_NATIVE", "1") == "0":
        return None
    try:
        from tessera.ptx import _fastscan
    except ImportError:
        return None
    return _fastscan if getattr(_fastscan, layout_attr, None) == expected else None
