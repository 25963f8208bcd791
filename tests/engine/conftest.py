"""Tiny Hugging Face models saved by the tests themselves: real safetensors, a tokenizer built with
`tokenizers` (word-level: token "wN" is id N; <unk> 0, <s> 1 prepended, </s> 2 the EOS), no downloads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

VOCAB = 128
TINY = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, bos_token_id=1, eos_token_id=2,
            pad_token_id=0, initializer_range=0.2)
ATTN = dict(TINY, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256)


def configs():
    from transformers import (
        LlamaConfig,
        Mamba2Config,
        MistralConfig,
        MixtralConfig,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    return {
        "llama": LlamaConfig(**ATTN),
        # a 5-token sliding window: prompts and outputs run past it in both chunks and decodes
        "mistral": MistralConfig(**ATTN, sliding_window=5),
        "qwen2": Qwen2Config(**ATTN),
        "qwen3": Qwen3Config(**ATTN, head_dim=16),
        "mixtral": MixtralConfig(**ATTN, num_local_experts=4, num_experts_per_tok=2),
        # layer 1 dense (mlp_only_layers), routing weights not renormalised
        "qwen3_moe": Qwen3MoeConfig(**ATTN, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=32, mlp_only_layers=[1], norm_topk_prob=False),
        # 2 groups of B/C, chunk 4: prompt pieces longer than a chunk take the multi-chunk SSD path
        "mamba2": Mamba2Config(**TINY, state_size=16, head_dim=16, num_heads=8, n_groups=2, chunk_size=4,
                               expand=2),
    }


def word_tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<unk>")


def save_model(family: str, directory: Path, seed: int = 0):
    """A randomly initialised transformers model of ``family`` and its tokenizer saved in ``directory``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(configs()[family]).eval()
    model.save_pretrained(directory)
    word_tokenizer(VOCAB).save_pretrained(directory)
    return model


@pytest.fixture(scope="session")
def saved(tmp_path_factory):
    """family -> (directory, transformers model), each saved once per session."""
    cache: dict[str, tuple[Path, object]] = {}

    def get(family: str):
        if family not in cache:
            d = tmp_path_factory.mktemp(family)
            cache[family] = (d, save_model(family, d))
        return cache[family]
    return get


def texts(lengths: list[int], seed: int = 1) -> list[str]:
    """Prompts of the given word counts, words drawn from the tokenizer's vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    return [" ".join(f"w{int(i)}" for i in torch.randint(3, VOCAB, (n,), generator=gen)) for n in lengths]
