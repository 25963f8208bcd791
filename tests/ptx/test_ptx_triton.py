"""Triton specialisations compiled to PTX: content-hash cache, architecture, parameter mapping."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tessera.capture.triton_launch import bind
from tessera.errors import UserError
from tessera.ptx import triton_ptx
from tessera.ptx.analysis import Access


@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
    """out = a·x + y: reads x and y, writes out."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, a * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def _spec(arch: int = 90, block: int = 64) -> triton_ptx.Specialisation:
    x = torch.zeros(100)
    return bind(_axpy, (x, x.clone(), x.clone(), 2.0, 100), {"BLOCK": block}, (2,), arch=arch).spec


def test_each_specialisation_compiles_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TESSERA_PTX_CACHE", str(tmp_path))
    triton_ptx.clear_memory_cache()
    before = triton_ptx.COMPILES["count"]
    first = triton_ptx.kernel_access(_axpy, _spec())
    assert triton_ptx.COMPILES["count"] == before + 1 and len(list(tmp_path.glob("*.ptx"))) == 1
    triton_ptx.kernel_access(_axpy, _spec())  # memory cache
    triton_ptx.clear_memory_cache()
    again = triton_ptx.kernel_access(_axpy, _spec())  # disk cache
    assert triton_ptx.COMPILES["count"] == before + 1 and again == first
    triton_ptx.kernel_access(_axpy, _spec(block=128))  # a different constexpr is another specialisation
    assert triton_ptx.COMPILES["count"] == before + 2 and len(list(tmp_path.glob("*.ptx"))) == 2


@pytest.mark.parametrize("arch", [80, 90])
def test_access_by_parameter_name_on_both_archs(arch: int, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TESSERA_PTX_CACHE", str(tmp_path))
    ka = triton_ptx.kernel_access(_axpy, _spec(arch))
    assert ka.access == {"x_ptr": Access.READ, "y_ptr": Access.READ, "out_ptr": Access.WRITTEN}
    assert f".target sm_{arch}" in triton_ptx.compile_ptx(_axpy, _spec(arch))


def test_bad_arch_is_one_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("TESSERA_PTX_ARCH", "75")
    with pytest.raises(UserError, match="TESSERA_PTX_ARCH '75'; valid: 80, 90"):
        triton_ptx.target_arch()
    with pytest.raises(ValueError, match="sm_75"):
        triton_ptx.Specialisation(kernel="k", params=(), types=(), constexprs=(), aligned=(), arch=75)
