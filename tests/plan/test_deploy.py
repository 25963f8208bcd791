"""From plan to service: the `tessera serve` line a plan prints parses with `tessera serve`'s own options
and carries the plan file's engine settings (read from the JSON independently); a baseline answer's vLLM and
SGLang launches by hand."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from typer.main import get_command

from tessera.cli.serve import register
from tessera.contracts.plan import Device, PhasePlan, Plan, PoolPlan
from tessera.plan import PlannerConfig, Traffic, plan_serving
from tessera.plan.deploy import launch_lines, peer_launches, result_json, save_deployment, tessera_launches

SPLIT = Path(__file__).parents[2] / "bench" / "results" / "engine_split_plan.json"


def serve_options(command: str) -> dict:
    """The command's options as `tessera serve` parses them (click's parser: unknown flags raise)."""
    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)  # two verbs, so the group keeps `serve` as a subcommand
    args = shlex.split(command)
    assert args[:2] == ["tessera", "serve"]
    ctx = get_command(app).commands["serve"].make_context("serve", args[2:])
    return ctx.params


def test_engine_plan_gives_a_serve_command_with_its_settings():
    doc = json.loads(SPLIT.read_text())
    (launch,) = tessera_launches(Plan.load(SPLIT), str(SPLIT))
    got = serve_options(launch.command)
    assert got["model"] == doc["model"] == "llama-wide"
    assert got["devices"] == "cpu,cpu:speed=0.5"  # the workers the engine planned over, by kind
    assert got["placement"] == str(SPLIT)
    assert (got["max_num_seqs"], got["max_num_batched_tokens"], got["microbatches"]) == (12, 64, 3)
    assert got["max_model_len"] == 48 + 48 and got["port"] == 8000
    assert peer_launches(Plan.load(SPLIT)) == []  # a split over two devices: no existing engine runs it


def one_gpu(replicas: int, gpu: str = "H100-SXM") -> Plan:
    """The split plan's shape made one device running everything, ``replicas`` copies."""
    p = Plan.load(SPLIT)
    mixed = p.phases["mixed"]
    return replace(p, model="llama-3-8b", devices=(Device(index=0, gpu=gpu, mem_bytes=80 * 2**30),),
                   memory_bytes=(p.memory_bytes[0],), replicas=replicas,
                   phases={"mixed": replace(mixed, assignment=(0,) * len(mixed.assignment))})


def test_replicas_each_on_their_own_gpu_and_port():
    plan = one_gpu(2)
    runs = [serve_options(x.command) for x in tessera_launches(plan, "p.json")]
    assert [(r["devices"], r["port"]) for r in runs] == [("cuda:0", 8000), ("cuda:1", 8001)]
    vllm = [x.command for x in peer_launches(plan) if x.engine == "vllm"]
    assert vllm == [
        "CUDA_VISIBLE_DEVICES=0 vllm serve meta-llama/Meta-Llama-3-8B --tensor-parallel-size 1 --max-num-seqs 12 "
        "--max-num-batched-tokens 64 --max-model-len 96 --port 8000",
        "CUDA_VISIBLE_DEVICES=1 vllm serve meta-llama/Meta-Llama-3-8B --tensor-parallel-size 1 --max-num-seqs 12 "
        "--max-num-batched-tokens 64 --max-model-len 96 --port 8001"]


def test_tensor_parallel_group_is_a_peer_launch_only():
    plan = one_gpu(2, gpu="2xH100-SXM")
    assert tessera_launches(plan, "p.json") == []
    sgl = [x.command for x in peer_launches(plan) if x.engine == "sglang"]
    assert sgl[1] == ("CUDA_VISIBLE_DEVICES=2,3 python -m sglang.launch_server --model-path "
                      "meta-llama/Meta-Llama-3-8B --tp 2 --max-running-requests 12 --chunked-prefill-size 64 "
                      "--context-length 96 --port 8101")
    assert "no `tessera serve` line" in launch_lines(plan, "p.json")[0]


def test_prefill_decode_plan():
    p = one_gpu(1)
    devices = (Device(index=0, gpu="H100-SXM", mem_bytes=1), Device(index=1, gpu="2xL40S", mem_bytes=1))
    phase = PhasePlan(phase="prefill", assignment=(0, 0, 0), microbatches=1, points=())
    pd = replace(p, devices=devices, memory_bytes=(p.memory_bytes[0],) * 2,
                 phases={"prefill": phase, "decode": replace(phase, phase="decode", assignment=(1, 1, 1))})
    got = {(x.engine, x.role): x.command for x in peer_launches(pd)}
    assert got[("vllm", "prefill")].startswith("CUDA_VISIBLE_DEVICES=0 vllm serve meta-llama/Meta-Llama-3-8B "
                                               "--tensor-parallel-size 1 ")
    assert got[("vllm", "decode")].startswith("CUDA_VISIBLE_DEVICES=1,2 vllm serve meta-llama/Meta-Llama-3-8B "
                                              "--tensor-parallel-size 2 ")
    assert got[("vllm", "prefill")].endswith("""'{"kv_connector":"P2pNcclConnector","kv_role":"kv_producer"}'""")
    assert "--disaggregation-mode decode" in got[("sglang", "decode")]
    assert got[("sglang", "router")] == ("python -m sglang_router.launch_router --pd-disaggregation --prefill "
                                         "http://127.0.0.1:8101 --decode http://127.0.0.1:8102 --port 8100")
    assert tessera_launches(pd, "p.json") == []


def test_report_prints_the_deploy_commands(tmp_path, run_cli):
    """`tessera report --plan` prints the serve line and puts it in the page's "Deploy it" section."""
    code, out, err = run_cli(["report", "--plan", str(SPLIT), "--out-dir", str(tmp_path)])
    assert code == 0, err
    want = (f"tessera serve llama-wide --devices cpu,cpu:speed=0.5 --placement {SPLIT} --max-num-seqs 12 "
            "--max-num-batched-tokens 64 --microbatches 3 --max-model-len 96 --port 8000")
    assert f"deploy with: {want}" in out and "as vllm" not in out
    page = (tmp_path / "report.html").read_text()
    assert '<section id="deploy"><h2>Deploy it</h2>' in page and want in page


@pytest.mark.slow
def test_plan_out_prints_the_serve_commands(tmp_path):
    """`tessera plan -o` prints one serve line per replica; each parses with `tessera serve`'s options and
    carries the saved plan's engine settings and traffic (read from the file's JSON)."""
    path = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-m", "tessera", "plan", "llama-tiny", "--gpus", "H100,H100", "--batch",
                        "2", "--prompt", "16", "--output", "8", "-o", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(path.read_text())
    lines = [x.removeprefix("deploy with: ") for x in r.stderr.splitlines() if x.startswith("deploy with: tessera")]
    assert len(lines) == doc["replicas"] >= 1
    for i, line in enumerate(lines):
        got = serve_options(line)
        assert got["placement"] == str(path) and got["model"] == "llama-tiny" and got["port"] == 8000 + i
        assert got["devices"].split(",") == [f"cuda:{i * len(doc['devices']) + d}" for d in range(len(doc["devices"]))]
        e = doc["engine"]
        assert (got["max_num_seqs"], got["max_num_batched_tokens"], got["microbatches"]) == (
            e["max_num_seqs"], e["max_num_batched_tokens"], e["microbatches"])
        assert got["max_model_len"] == 16 + 8


def test_save_deployment_writes_the_plan_and_says_how_to_serve_it(tmp_path) -> None:
    """`tessera plan -o`: the file read back is Tessera's deployment; the lines name it, then how to serve
    it (a single plan: launch_lines; a pool of different cells: one serve per cell)."""
    cfg = PlannerConfig(traffic=Traffic(prompt=16, output=8))
    r = plan_serving("llama-tiny", "H100,L40S", cfg)
    path = tmp_path / "p.json"
    lines = save_deployment(r, path)
    deployment = r.tessera.deployment
    if deployment is r.tessera.plan:
        assert Plan.load(path) == deployment
        assert lines == [f"wrote {path} (Tessera's plan of llama-tiny)", *launch_lines(deployment, str(path))]
    else:
        assert PoolPlan.load(path) == deployment
        assert lines[0] == f"wrote {path} (Tessera's pool plan of llama-tiny)"
        assert lines[1].startswith("deploy with: one `tessera serve` per cell")
    j = json.loads(result_json(r, cfg))
    assert set(j) == {*r.to_json(), "provenance"} and j["provenance"]["model"] == "llama-tiny"
