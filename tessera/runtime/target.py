"""What `tessera run TARGET` names: a plan file, or a model (zoo name, config.json, checkpoint folder).

A JSON file is read here once, so that a file that is not JSON, or JSON that is neither a plan nor a model
config (the table `plan --json` prints, a simulation's result), is one line naming the file, what it is,
and what `run` takes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tessera.contracts.plan import Plan, PoolPlan, read_plan_file
from tessera.errors import UserError, read_text
from tessera.text import plural

TAKES = ("`run` takes a plan written by `tessera plan MODEL --gpus ... -o PLAN.json`, a model name "
         "(`tessera models`), a config.json or a checkpoint folder")


def _kind(d: dict[str, Any]) -> str | None:
    """What a JSON object Tessera wrote is, when it is not a plan nor a config; None when unknown."""
    if "strategies" in d and "chosen" in d:
        return "the strategy table `tessera plan --json` prints"
    if "completed" in d or "goodput_per_s" in d and "provenance" in d:
        return "a simulation's result (`tessera simulate --json`)"
    if "mix" in d:
        return "an advisor's answer (`tessera advise --json`)"
    return None


def run_target(target: str) -> Plan | None:
    """The Plan in ``target`` when it is a plan file; None when it names a model. A pool plan, a file that
    is not JSON, or a JSON object that is neither a plan nor a model config is one UserError."""
    path = Path(target)
    if path.suffix != ".json" or not path.is_file():
        return None
    try:
        d = json.loads(read_text(path, "file"))
    except json.JSONDecodeError as e:
        raise UserError(f"{target} is not JSON ({e.msg}, line {e.lineno}); {TAKES}") from None
    if not isinstance(d, dict):
        raise UserError(f"{target} holds a JSON {type(d).__name__}, not an object; {TAKES}")
    if "phases" in d or "cells" in d:
        plan = read_plan_file(path)  # its mistakes name the file
        if isinstance(plan, PoolPlan):
            raise UserError(f"plan {target} is a pool of {plural(len(plan.cells), 'different cell')} "
                            f"({plan.strategy}); each runs alone: plan one cell "
                            f"(`tessera plan MODEL --gpus ... -o PLAN.json`) and run that")
        return plan
    if "model_type" in d or "_class_name" in d:
        return None  # a model config: the zoo's loader reads it
    kind = _kind(d)
    what = f"is {kind}, not a plan" if kind else "is neither a plan nor a model config"
    raise UserError(f"{target} {what}; {TAKES}")
