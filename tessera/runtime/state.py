"""Resident buffers between steps: carrying KV/state into the next step's shapes, loading weights."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from tessera.errors import UserError
from tessera.graph import Buffer
from tessera.runtime.device import HOST


def dtype_of(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    assert isinstance(dt, torch.dtype), f"unknown dtype {name!r}"
    return dt


def typed(st: torch.UntypedStorage, buf: Buffer) -> torch.Tensor:
    """The storage as the contiguous tensor the buffer was registered as (KV caches, SSM states)."""
    dt = dtype_of(buf.dtype)
    assert st.nbytes() >= math.prod(buf.shape) * dt.itemsize, f"storage of {buf.name} smaller than its shape"
    return torch.empty(0, dtype=dt, device=st.device).set_(st, 0, buf.shape)


def carry(st: torch.UntypedStorage, old: Buffer, new: Buffer) -> torch.UntypedStorage:
    """KV written at one cache length, continued at another: copy the overlap, zeros elsewhere.

    A decode step captured at context c holds a cache of c+1 slots; the previous step's cache has c.
    """
    assert len(old.shape) == len(new.shape) and old.dtype == new.dtype, f"cannot carry {old.name} into {new.name}"
    src = typed(st, old)
    out = torch.zeros(new.shape, dtype=src.dtype, device=src.device)
    sl = tuple(slice(0, min(a, b)) for a, b in zip(old.shape, new.shape, strict=True))
    out[sl] = src[sl]
    return out.untyped_storage()


def weight_files(directory: str) -> list[Path]:
    """The safetensors files of a --weights directory; a missing path, a file, or a directory without any
    is one UserError (checked by the driver before any worker starts, and by each worker as it loads)."""
    path = Path(directory)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is a file, not a directory"
        raise UserError(f"--weights {directory} {what}; give a directory of *.safetensors files")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UserError(f"--weights {directory}: no *.safetensors files there")
    return files


def load_weights(directory: str, wanted: dict[str, Buffer], device: torch.device = HOST
                 ) -> dict[str, torch.UntypedStorage]:
    """Read only the ``wanted`` tensors from the safetensors files in ``directory``, onto ``device``."""
    from safetensors import safe_open

    files = weight_files(directory)
    got: dict[str, torch.UntypedStorage] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if key in wanted and key not in got:
                    buf = wanted[key]
                    t = fh.get_tensor(key)
                    if tuple(t.shape) != tuple(buf.shape):
                        raise UserError(f"--weights {directory}: tensor {key} has shape {tuple(t.shape)}, "
                                        f"the model needs {tuple(buf.shape)}")
                    got[key] = t.to(device=device, dtype=dtype_of(buf.dtype)).contiguous().untyped_storage()
    missing = sorted(set(wanted) - set(got))
    if missing:
        raise UserError(f"--weights {directory}: {len(missing)} tensors missing, e.g. {missing[0]}")
    return got
