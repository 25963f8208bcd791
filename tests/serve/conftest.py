"""Servers for the tests: llama-tiny with dummy weights in fp32 (byte tokens, no chat template), and a
tiny Llama saved here with a word-level tokenizer and a chat template (token "wN" is id N; <s> 1
prepended, </s> 2 the EOS); each run in this process on a free port (the program in the engine thread,
uvicorn in another), or as `python -m tessera serve` for the signal and worker-loss tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import pytest
import torch

from tessera.engine.config import EngineConfig
from tessera.engine.engine import load_engine
from tessera.engine.serve import InProcess
from tessera.runtime.cluster import free_port
from tessera.serve.config import ServerConfig
from tessera.serve.launch import Running

VOCAB = 128
# each message as "w4 <content>" (system), "w5 <content>" (user) or "w6 <content>" (assistant); then w7
CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'system' %}w4{% elif m['role'] == 'user' %}w5"
                 "{% else %}w6{% endif %} {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w7"
                 "{% endif %}")
TINY_CONFIG = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)


def save_chat_model(directory: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.2)
    LlamaForCausalLM(config).eval().save_pretrained(directory)
    words = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, VOCAB)}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return directory


def start(model: str, *, load_format: str, config: EngineConfig = TINY_CONFIG, max_waiting: int = 64,
          name: str = "tiny") -> Running:
    engine = load_engine(model, config, dtype="fp32", load_format=load_format)
    server = ServerConfig(served_model_name=name, port=0, max_waiting=max_waiting)
    return Running(engine, InProcess(engine), server, quiet=True).start_background()


@pytest.fixture(scope="module")
def tiny():
    """llama-tiny, dummy weights, fp32, served in this process."""
    running = start("llama-tiny", load_format="dummy")
    yield running
    running.close()


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory) -> Path:
    return save_chat_model(tmp_path_factory.mktemp("chat"))


@pytest.fixture(scope="module")
def chat(chat_dir):
    running = start(str(chat_dir), load_format="auto", name="chat")
    yield running
    running.close()


def reference(model: str, load_format: str, config: EngineConfig = TINY_CONFIG):
    """The engine called directly, as `tessera generate` runs it (same weights, dtype and settings)."""
    return load_engine(model, config, dtype="fp32", load_format=load_format)


def wait_until(check, timeout_s: float = 60.0, what: str = "condition") -> None:
    """Poll ``check`` until true (a liveness wait: the deadline only stops a hung test)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout_s} s")
        time.sleep(0.02)


class Subprocess:
    """`python -m tessera serve ARGS --port P` in its own process; its stderr kept in a file."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = dict(os.environ, OMP_NUM_THREADS="1")
        argv = [sys.executable, "-m", "tessera", "serve", *args, "--port", str(self.port)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("w"), env=env)

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                return httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200
            except httpx.TransportError:
                return False
        wait_until(up, timeout_s, "server ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture
def subprocess_server(tmp_path):
    started: list[Subprocess] = []

    def run(args: list[str]) -> Subprocess:
        s = Subprocess(args, tmp_path / f"server{len(started)}.log")
        started.append(s)
        s.wait_ready()
        return s
    yield run
    for s in started:
        s.stop()
