"""Triton kernels compiled to PTX without a GPU (run in a throwaway venv with triton installed):
    python triton_kernels.py   ->   triton/<name>.ptx   (target: CUDA sm_90, 32-wide warps)
"""

from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def tr_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def tr_scale_inplace(x_ptr, s, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * s, mask=mask)


@triton.jit
def tr_softmax(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * cols + offs, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def tr_atomic_sum(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(total_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))


@triton.jit
def tr_gather(src_ptr, idx_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    i = tl.load(idx_ptr + row)
    tl.store(out_ptr + row * cols + offs, tl.load(src_ptr + i * cols + offs, mask=offs < cols), mask=offs < cols)


KERNELS = {
    tr_add: {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
    tr_scale_inplace: {"x_ptr": "*fp32", "s": "fp32", "n": "i32", "BLOCK": "constexpr"},
    tr_softmax: {"x_ptr": "*fp32", "y_ptr": "*fp32", "cols": "i32", "BLOCK": "constexpr"},
    tr_atomic_sum: {"x_ptr": "*fp32", "total_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
    tr_gather: {"src_ptr": "*fp32", "idx_ptr": "*i64", "out_ptr": "*fp32", "cols": "i32", "BLOCK": "constexpr"},
}

if __name__ == "__main__":
    out = Path(__file__).parent / "triton"
    out.mkdir(exist_ok=True)
    for fn, sig in KERNELS.items():
        src = ASTSource(fn=fn, signature=sig, constexprs={"BLOCK": 256})
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
        (out / f"{fn.__name__}.ptx").write_text(compiled.asm["ptx"])
        print(fn.__name__)
