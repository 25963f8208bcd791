"""Hugging Face directories: shards read by name, only the tensors asked for; a missing or unexpected tensor
is one line; computed tensors (rotary tables) never needed."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tessera.engine import EngineConfig, SamplingParams, load_engine
from tessera.engine.loader import INDEX, load_weights, open_model
from tessera.engine.models import build_model
from tessera.engine.program import Program
from tessera.errors import UserError
from tests.engine.conftest import save_model

CONFIG = EngineConfig(max_num_seqs=2, max_num_batched_tokens=8, page_size=4, max_model_len=32)


def copy_with(src, dst, change):
    """``src`` copied to ``dst`` with its single safetensors file's tensors passed through ``change``."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    save_file(change(tensors), dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_missing_and_unexpected_tensors(saved, tmp_path):
    directory, _ = saved("llama")
    gone = copy_with(directory, tmp_path / "gone",
                     lambda t: {k: v for k, v in t.items() if k != "model.layers.1.mlp.up_proj.weight"})
    with pytest.raises(UserError, match=r"1 tensor\(s\) missing .* 'model.layers.1.mlp.up_proj.weight'"):
        load_engine(str(gone), CONFIG, dtype="fp32")
    extra = copy_with(directory, tmp_path / "extra",
                      lambda t: {**t, "model.layers.0.mlp.bias": torch.zeros(3)})
    with pytest.raises(UserError, match="unexpected tensor.*'model.layers.0.mlp.bias'"):
        load_engine(str(extra), CONFIG, dtype="fp32")
    rotary = copy_with(directory, tmp_path / "rotary",
                       lambda t: {**t, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8)})
    load_engine(str(rotary), CONFIG, dtype="fp32")  # an old checkpoint's rotary table is skipped


def test_shards_and_a_share(tmp_path):
    """A sharded checkpoint (with its index) loads like one file; loading one layer's nodes reads only their
    tensors (bytes by hand: layer 0 of the tiny llama in fp32)."""
    whole = tmp_path / "whole"
    model = save_model("llama", whole)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="40KB")
    shutil.copy(whole / "tokenizer.json", sharded / "tokenizer.json")
    shutil.copy(whole / "tokenizer_config.json", sharded / "tokenizer_config.json")
    assert (sharded / INDEX).is_file() and len(list(sharded.glob("*.safetensors"))) > 1
    outs = [load_engine(str(d), CONFIG, dtype="fp32").generate([[1, 5, 9]], SamplingParams(max_tokens=4))
            for d in (whole, sharded)]
    assert outs[0] == outs[1]
    net = build_model(open_model(str(sharded)).arch, torch.float32, "cpu")
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(math.nan)
    program = Program(net)
    layer0 = [n for n in program.kernels if program.layer_of(n) == 0]
    names = program.parameter_names(layer0)
    read = load_weights(net, sharded, names)
    per_layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64
    assert read == 4 * per_layer and len(names) == 9
    for name, p in net.named_parameters():
        assert bool(torch.isnan(p).any()) == (name not in names), name


def test_bf16_weights(saved):
    directory, _ = saved("qwen3")
    engine = load_engine(str(directory), CONFIG, dtype="bf16")
    assert {p.dtype for p in engine.program.model.parameters()} == {torch.bfloat16}
    assert engine.program.model.model.layers[0].self_attn.rotary_emb.inv_freq.dtype == torch.float32
    out = engine.generate([[1, 5, 9]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3


def test_a_nodes_share_includes_weights_handed_to_custom_ops():
    """The scan node reads A_log, D and dt_bias through get_attr nodes: its share lists them; the tied head's
    share is the embedding's tensor, the name the checkpoint stores."""
    engine = load_engine("mamba2-tiny", CONFIG, dtype="fp32", load_format="dummy")
    program = engine.program
    scan = next(n for n in program.kernels if n.name == "mamba_scan_default_1")
    mixer = "backbone.layers.1.mixer"
    assert program.parameter_names([scan]) == {f"{mixer}.{p}" for p in ("A_log", "D", "dt_bias")}
    assert {name for name, _ in program.resident(scan)} >= {f"{mixer}.ssm_state"}
    head = next(n for n in program.kernels if n.name == "lm_head")
    assert program.parameter_names([head]) == {"backbone.embeddings.weight"}
