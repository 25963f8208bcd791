"""Models from a Hugging Face directory or a zoo name, and their weights, shard by shard.

A directory is what ``save_pretrained`` writes: config.json, ``model.safetensors`` or shards named by
``model.safetensors.index.json``, tokenizer files. ``load_weights`` reads only the tensors it is asked
for (a worker's share: ``Program.parameter_names(nodes)``), each straight from its shard into the
model's parameter, cast to the model's dtype; ``load_named`` does the same for a worker's tensors by
checkpoint name. ``dummy_weights`` fills random weights (transformers' initialisation: normal(0, 0.02)
matrices, unit norms, Mamba-2's A and dt as at its init), each parameter from its own name's seeded
stream (``dummy_fill``), for zoo models and benchmarks.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from tessera.capture.anymodel import load_config
from tessera.capture.zoo import SPECS, model_names
from tessera.engine.arch import SUPPORTED, ModelArch, arch_of
from tessera.errors import UserError

INDEX = "model.safetensors.index.json"
# Tensors some checkpoints carry that are computed here, never loaded (rotary tables).
COMPUTED_SUFFIXES = (".rotary_emb.inv_freq", ".rotary_emb.cos_cached", ".rotary_emb.sin_cached")
INIT_STD = 0.02  # transformers' default initializer_range


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """Where a model comes from: a zoo name (config only) or a directory (config, weights, tokenizer)."""

    name: str
    arch: ModelArch
    directory: Path | None = None
    config_dtype: str | None = None  # the checkpoint's dtype as its config names it ("bfloat16", ...)

    @property
    def has_weights(self) -> bool:
        return self.directory is not None and bool(_shards(self.directory))


def open_model(target: str) -> ModelSource:
    """A zoo name (``tessera models``) or a model directory / config.json; one line if neither."""
    if target in SPECS:
        return ModelSource(name=target, arch=arch_of(dict(SPECS[target].config), target))
    path = Path(target)
    if not path.exists():
        zoo = [n for n in model_names() if SPECS[n].config.get("model_type") in SUPPORTED]
        raise UserError(f"unknown model {target!r}: not a directory; valid: {', '.join(zoo)}, or a Hugging "
                        f"Face model directory")
    cfg, file = load_config(target)
    return ModelSource(name=file.parent.name if path.is_dir() else file.stem, arch=arch_of(cfg, str(file)),
                       directory=file.parent if path.is_dir() else None,
                       config_dtype=cfg.get("dtype") or cfg.get("torch_dtype"))


def _shards(directory: Path) -> dict[str, Path]:
    """tensor name -> shard file, from the index where there is one, else from every *.safetensors file."""
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise UserError(f"cannot read {index}: {e}") from None
        return {name: directory / file for name, file in weight_map.items()}
    out: dict[str, Path] = {}
    for file in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(file), "pt") as f:
                out.update((k, file) for k in f.keys())  # noqa: SIM118 (safe_open is not a mapping)
        except (SafetensorError, OSError) as e:
            raise UserError(f"cannot read {file}: {e}") from None
    return out


def check_names(model: nn.Module, directory: Path) -> dict[str, Path]:
    """The checkpoint's tensor -> shard map, after checking it holds exactly the model's parameters
    (computed tensors and a tied head's copy aside): one line naming a missing or an unexpected tensor."""
    shards = _shards(directory)
    if not shards:
        raise UserError(f"model directory {directory} holds no *.safetensors weights; use --load-format "
                        f"dummy for random weights")
    params = dict(model.named_parameters())
    missing = sorted(n for n in params if n not in shards)
    if missing:
        raise UserError(f"{directory}: {len(missing)} tensor(s) missing from the checkpoint, e.g. "
                        f"{missing[0]!r}")
    tied = {"lm_head.weight"} if "lm_head.weight" not in params else set()
    extra = sorted(n for n in shards
                   if n not in params and n not in tied and not n.endswith(COMPUTED_SUFFIXES))
    if extra:
        raise UserError(f"{directory}: {len(extra)} unexpected tensor(s) in the checkpoint, e.g. "
                        f"{extra[0]!r} (the engine's {type(model).__name__} has no such parameter)")
    return shards


def load_weights(model: nn.Module, directory: Path, names: set[str] | None = None) -> int:
    """Copy the checkpoint's tensors ``names`` (all parameters when None) into the model, one shard at a
    time, each cast to its parameter's dtype; returns the bytes read from disk."""
    check_names(model, directory)
    params = dict(model.named_parameters())
    wanted = set(params) if names is None else names
    unknown = wanted - set(params)
    if unknown:
        raise ValueError(f"load_weights: {sorted(unknown)[:3]} are not parameters of the model")
    return load_named(directory, {n: [params[n]] for n in wanted})


def load_named(directory: Path, targets: dict[str, list[torch.Tensor]]) -> int:
    """Copy each checkpoint tensor named in ``targets`` into every tensor listed for it (a worker's share:
    only these names are read, one shard at a time); returns the bytes read. A missing tensor or a shape
    that disagrees is one line naming it."""
    shards = _shards(directory)
    if not shards:
        raise UserError(f"model directory {directory} holds no *.safetensors weights; use --load-format "
                        f"dummy for random weights")
    missing = sorted(n for n in targets if n not in shards)
    if missing:
        raise UserError(f"{directory}: {len(missing)} tensor(s) missing from the checkpoint, e.g. "
                        f"{missing[0]!r}")
    by_file: dict[Path, list[str]] = {}
    for n in sorted(targets):
        by_file.setdefault(shards[n], []).append(n)
    read = 0
    for file, names in by_file.items():
        with safe_open(str(file), "pt") as f, torch.no_grad():
            for n in names:
                t = f.get_tensor(n)
                for p in targets[n]:
                    if tuple(t.shape) != tuple(p.shape):
                        raise UserError(f"{file.name}: tensor {n!r} has shape {tuple(t.shape)}, the config "
                                        f"makes it {tuple(p.shape)}")
                    p.copy_(t)
                read += t.numel() * t.element_size()
    return read


def dummy_weights(model: nn.Module, seed: int) -> None:
    """Random weights (``dummy_fill``) for every parameter of the model, each from its own name's stream."""
    for name, p in model.named_parameters():
        dummy_fill(name, p, seed)


def dummy_fill(name: str, p: torch.Tensor, seed: int) -> None:
    """Random values for parameter ``name`` as transformers initialises them: matrices and embeddings
    normal(0, 0.02), biases 0, norm weights 1; Mamba-2's A_log = log(1..H), D = 1, dt_bias the inverse
    softplus of dt log-uniform in [0.001, 0.1] (its time_step_min/max defaults). Each name draws from a
    generator seeded by (seed, name), so a worker holding a share of the model fills its tensors exactly
    as the whole model's are filled."""
    gen = torch.Generator().manual_seed((seed << 32) ^ zlib.crc32(name.encode()))
    leaf = name.rsplit(".", 1)[-1]
    with torch.no_grad():
        if leaf == "A_log":
            p.copy_(torch.log(torch.arange(1, p.numel() + 1, dtype=torch.float32)))
        elif leaf == "dt_bias":
            lo, hi = math.log(0.001), math.log(0.1)
            dt = torch.exp(torch.rand(p.shape, generator=gen) * (hi - lo) + lo)
            p.copy_(dt + torch.log(-torch.expm1(-dt)))
        elif leaf == "D" or (leaf == "weight" and p.dim() == 1):
            p.fill_(1.0)
        elif leaf == "bias":
            p.zero_()
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * INIT_STD)
