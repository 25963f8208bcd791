"""From plan to service: the commands that deploy a Plan.

``tessera serve`` runs a plan whose cell is one or more single GPUs under a kernel placement (its "mixed"
phase): one server per replica, replica r on the GPUs ``cuda:r·n .. cuda:r·n + n − 1`` (a plan the engine
made over CPU workers: their kinds) and port ``port + r``, the plan's engine settings as vLLM names them (``--max-num-seqs``, ``--max-num-batched-tokens``,
``--microbatches``) and its traffic's longest request as ``--max-model-len``. Tessera's engine has no tensor
parallelism inside a worker and no prefill/decode split, so a cell of tensor-parallel groups, or a
prefill/decode plan, gets no ``tessera serve`` line.

An answer that is a baseline an existing engine already runs also gets that engine's launch: a cell that is
one device (a GPU, or a group of k GPUs: tensor parallel, or MoE data-parallel attention with expert
parallelism) running the whole model is vLLM's ``--tensor-parallel-size k`` (``--data-parallel-size k
--enable-expert-parallel``) and SGLang's ``--tp k`` (``--dp k --enable-dp-attention --ep-size k``), one
server per replica; a prefill/decode plan is vLLM's disaggregated prefill (a ``kv_producer`` and a
``kv_consumer`` instance joined by a KV connector) and SGLang's ``--disaggregation-mode prefill|decode``
behind its router.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tessera.capture.zoo import SPECS
from tessera.contracts.enums import Phase
from tessera.contracts.plan import Plan
from tessera.errors import UserError
from tessera.plan.config import PlannerConfig, ServingResult, planner_provenance

UNIT = re.compile(r"^(\d+)x(.+?)(-dp-ep|-dp-tp)?$")  # tessera.plan.model.units.unit_name: 2xH100-SXM, 8xH200-dp-ep


@dataclass(frozen=True, kw_only=True)
class Launch:
    """One process to start: which engine, its role in the deployment, the command line."""

    engine: str  # tessera | vllm | sglang
    role: str  # serve (a replica's server) | prefill | decode | router
    command: str

    def __post_init__(self) -> None:
        if self.engine not in ("tessera", "vllm", "sglang"):
            raise ValueError(f"launch engine {self.engine!r}: tessera, vllm or sglang")


def unit(gpu: str) -> tuple[int, str, str]:
    """(GPUs, catalog GPU, layout: tp | dp-ep | dp-tp) of a plan device's name."""
    m = UNIT.match(gpu)
    if m is None:
        return 1, gpu, "tp"
    return int(m.group(1)), m.group(2), (m.group(3) or "-tp").removeprefix("-")


def hf_name(model: str) -> str:
    """The Hugging Face repository a zoo model's config comes from (vLLM and SGLang load by it), else the name."""
    spec = SPECS.get(model)
    first = spec.source.split()[0] if spec is not None else ""
    return first if "/" in first else model


def max_model_len(plan: Plan) -> int | None:
    w = plan.workload
    return w.prompt + w.output if w.prompt and w.output else None


def tessera_launches(plan: Plan, plan_path: str, *, port: int = 8000) -> list[Launch]:
    """One ``tessera serve`` per replica (none for a plan Tessera's engine cannot run: module docstring)."""
    if plan.engine is None or set(plan.phases) != {Phase.MIXED} or any(unit(d.gpu)[0] > 1 for d in plan.devices):
        return []
    n, e, mml = len(plan.devices), plan.engine, max_model_len(plan)
    out = []
    for r in range(plan.replicas):
        args = ["tessera", "serve", plan.model, "--devices", ",".join(worker(d.gpu, r * n + i)
                                                                     for i, d in enumerate(plan.devices)),
                "--placement", plan_path, "--max-num-seqs", str(e.max_num_seqs),
                "--max-num-batched-tokens", str(e.max_num_batched_tokens), "--microbatches", str(e.microbatches),
                *(["--max-model-len", str(mml)] if mml else []), "--port", str(port + r)]
        out.append(Launch(engine="tessera", role="serve", command=shlex.join(args)))
    return out


def worker(gpu: str, index: int) -> str:
    """The engine's --devices entry for a plan device: an engine-made plan's CPU worker kind as it is, a GPU
    as the CUDA device of its position."""
    return gpu if gpu == "cpu" or gpu.startswith("cpu:") else f"cuda:{index}"


def is_homogeneous(plan: Plan) -> bool:
    """One device (a GPU or a group) runs the whole model in every replica: what vLLM and SGLang deploy."""
    return len(plan.devices) == 1 and set(plan.phases) == {Phase.MIXED}


def is_prefill_decode(plan: Plan) -> bool:
    return set(plan.phases) == {Phase.PREFILL, Phase.DECODE} and all(
        len(set(p.assignment)) == 1 for p in plan.phases.values())


def peer_launches(plan: Plan, *, port: int = 8000) -> list[Launch]:
    """vLLM's and SGLang's launch of a baseline answer (module docstring); none for another placement."""
    if plan.engine is None:
        return []
    if is_homogeneous(plan):
        return homogeneous_launches(plan, port)
    if is_prefill_decode(plan):
        return pd_launches(plan, port)
    return []


def homogeneous_launches(plan: Plan, port: int) -> list[Launch]:
    k, _, layout = unit(plan.devices[0].gpu)
    if layout == "dp-tp":  # attention DP with experts TP: no single flag in either engine
        return []
    model, e, mml = hf_name(plan.model), plan.engine, max_model_len(plan)
    vllm_par = ["--tensor-parallel-size", str(k)] if layout == "tp" else [
        "--data-parallel-size", str(k), "--enable-expert-parallel"]
    sgl_par = ["--tp", str(k)] if layout == "tp" else ["--tp", str(k), "--dp", str(k), "--enable-dp-attention",
                                                       "--ep-size", str(k)]
    out = []
    for r in range(plan.replicas):
        gpus = ",".join(str(r * k + i) for i in range(k))
        mml_v = ["--max-model-len", str(mml)] if mml else []
        mml_s = ["--context-length", str(mml)] if mml else []
        out.append(Launch(engine="vllm", role="serve", command=f"CUDA_VISIBLE_DEVICES={gpus} " + shlex.join(
            ["vllm", "serve", model, *vllm_par, "--max-num-seqs", str(e.max_num_seqs),
             "--max-num-batched-tokens", str(e.max_num_batched_tokens), *mml_v, "--port", str(port + r)])))
        out.append(Launch(engine="sglang", role="serve", command=f"CUDA_VISIBLE_DEVICES={gpus} " + shlex.join(
            ["python", "-m", "sglang.launch_server", "--model-path", model, *sgl_par, "--max-running-requests",
             str(e.max_num_seqs), "--chunked-prefill-size", str(e.max_num_batched_tokens), *mml_s,
             "--port", str(port + 100 + r)])))
    return out


def pd_launches(plan: Plan, port: int) -> list[Launch]:
    """One prefill and one decode instance (the plan's replicas: that many pairs; the first shown)."""
    model, e, mml = hf_name(plan.model), plan.engine, max_model_len(plan)
    dev = {n: plan.phases[n].assignment[0] for n in (Phase.PREFILL, Phase.DECODE)}
    tp = {n: unit(plan.devices[dev[n]].gpu)[0] for n in dev}
    gpus, first = {}, 0
    for n in (Phase.PREFILL, Phase.DECODE):
        gpus[n] = ",".join(str(first + i) for i in range(tp[n]))
        first += tp[n]
    mml_v = ["--max-model-len", str(mml)] if mml else []
    out = []
    for i, (n, role) in enumerate((("prefill", "kv_producer"), ("decode", "kv_consumer"))):
        kv = json.dumps({"kv_connector": "P2pNcclConnector", "kv_role": role}, separators=(",", ":"))
        out.append(Launch(engine="vllm", role=n, command=f"CUDA_VISIBLE_DEVICES={gpus[n]} " + shlex.join(
            ["vllm", "serve", model, "--tensor-parallel-size", str(tp[n]), "--max-num-seqs", str(e.max_num_seqs),
             "--max-num-batched-tokens", str(e.max_num_batched_tokens), *mml_v, "--port", str(port + 1 + i),
             "--kv-transfer-config", kv])))
    for i, n in enumerate(("prefill", "decode")):
        out.append(Launch(engine="sglang", role=n, command=f"CUDA_VISIBLE_DEVICES={gpus[n]} " + shlex.join(
            ["python", "-m", "sglang.launch_server", "--model-path", model, "--tp", str(tp[n]),
             "--disaggregation-mode", n, "--max-running-requests", str(e.max_num_seqs),
             "--chunked-prefill-size", str(e.max_num_batched_tokens), "--port", str(port + 101 + i)])))
    out.append(Launch(engine="sglang", role="router", command=shlex.join(
        ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation", "--prefill",
         f"http://127.0.0.1:{port + 101}", "--decode", f"http://127.0.0.1:{port + 102}", "--port",
         str(port + 100)])))
    return out


def launch_lines(plan: Plan, plan_path: str, *, port: int = 8000) -> list[str]:
    """What `tessera plan -o` and the report print: the tessera serve command(s), then any vLLM / SGLang
    equivalent, one line each (a note where Tessera's engine cannot run the plan)."""
    ours = tessera_launches(plan, plan_path, port=port)
    peers = peer_launches(plan, port=port)
    lines = [f"deploy with: {x.command}" for x in ours] or [
        "deploy with: no `tessera serve` line: Tessera's engine runs single-GPU workers under a kernel "
        "placement (no tensor-parallel groups, no prefill/decode split)"]
    lines += [f"  as {x.engine} ({x.role}): {x.command}" for x in peers]
    return lines


def save_deployment(r: ServingResult, path: str | Path) -> list[str]:
    """Write Tessera's deployment of ``r`` to ``path`` (`tessera plan -o`): its plan, or a pool plan when the
    answer is several different cells. Returns the lines that say what was written and how to deploy it."""
    deployment = r.tessera.deployment
    if deployment is None:
        raise UserError(f"no feasible plan to write to {path}: {r.tessera.reason or 'nothing fits'}")
    deployment.save(path)
    if deployment is not r.tessera.plan:
        return [f"wrote {path} (Tessera's pool plan of {r.model})",
                "deploy with: one `tessera serve` per cell of the pool, each with that cell's own plan "
                "(`tessera plan MODEL --gpus CELL -o cell.json` prints it)"]
    return [f"wrote {path} (Tessera's plan of {r.model})", *launch_lines(deployment, str(path))]


def result_json(r: ServingResult, cfg: PlannerConfig) -> str:
    """`tessera plan --json`'s text: the result's contract with the provenance of Tessera's deployment."""
    prov = planner_provenance(r.model, cfg, r.tessera.deployment, images=r.images)
    return json.dumps({**r.to_json(), "provenance": prov.to_dict()})
