"""A thin named-model builder over HiGHS (highspy): columns and rows collected in Python, passed in bulk.

Every column and row carries a name (the PLANNER.md symbol plus its indices, e.g. ``x[12,1]``) so that
``write_lp`` output reads like the formulation. HiGHS prints banner lines to fd 1 even with
``output_flag=False``; construction and solve run with fd 1 redirected to /dev/null.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import highspy
import numpy as np

INF = math.inf


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Redirect the C-level stdout (fd 1) to /dev/null; HiGHS writes there directly."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


@dataclass(frozen=True, kw_only=True)
class Solution:
    status: str  # "optimal" | "feasible" (time limit with an incumbent) | "infeasible" | other HiGHS text
    objective: float
    values: np.ndarray  # [columns]
    solve_s: float
    mip_gap: float

    @property
    def ok(self) -> bool:
        return self.status in ("optimal", "feasible")


class Model:
    """Columns (lb, ub, cost, integer) and sparse rows (lb <= a·x <= ub), each with a name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.col_names: list[str] = []
        self.col_lb: list[float] = []
        self.col_ub: list[float] = []
        self.col_cost: list[float] = []
        self.col_int: list[bool] = []
        self.row_names: list[str] = []
        self.row_lb: list[float] = []
        self.row_ub: list[float] = []
        self.row_idx: list[list[int]] = []
        self.row_val: list[list[float]] = []

    def var(self, name: str, *, lb: float = 0.0, ub: float = INF, cost: float = 0.0,
            integer: bool = False) -> int:
        self.col_names.append(name)
        self.col_lb.append(lb)
        self.col_ub.append(ub)
        self.col_cost.append(cost)
        self.col_int.append(integer)
        return len(self.col_names) - 1

    def row(self, name: str, terms: dict[int, float] | list[tuple[int, float]], *, lb: float = -INF,
            ub: float = INF) -> int:
        items = terms.items() if isinstance(terms, dict) else terms
        acc: dict[int, float] = {}
        for j, a in items:
            acc[j] = acc.get(j, 0.0) + a
        self.row_names.append(name)
        self.row_lb.append(lb)
        self.row_ub.append(ub)
        self.row_idx.append(list(acc))
        self.row_val.append(list(acc.values()))
        return len(self.row_names) - 1

    @property
    def n_cols(self) -> int:
        return len(self.col_names)

    @property
    def n_rows(self) -> int:
        return len(self.row_names)

    def _highs(self, relax: bool) -> highspy.Highs:
        with _quiet_stdout():
            h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        n = self.n_cols
        h.addVars(n, np.array(self.col_lb), np.array(self.col_ub))
        h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(self.col_cost, dtype=float))
        ints = [j for j, i in enumerate(self.col_int) if i]
        if ints and not relax:
            h.changeColsIntegrality(len(ints), np.array(ints, dtype=np.int32),
                                    np.array([highspy.HighsVarType.kInteger] * len(ints)))
        starts = np.cumsum([0] + [len(r) for r in self.row_idx[:-1]]).astype(np.int32) if self.row_idx else []
        if self.n_rows:
            idx = np.array([j for r in self.row_idx for j in r], dtype=np.int32)
            val = np.array([a for r in self.row_val for a in r], dtype=float)
            h.addRows(self.n_rows, np.array(self.row_lb), np.array(self.row_ub), len(idx),
                      np.asarray(starts, dtype=np.int32), idx, val)
        for j, nm in enumerate(self.col_names):
            h.passColName(j, nm)
        for i, nm in enumerate(self.row_names):
            h.passRowName(i, nm)
        return h

    def solve(self, *, relax: bool = False, mip_rel_gap: float = 0.0, time_limit_s: float = 60.0,
              starts: list[np.ndarray] | None = None, threads: int = 1) -> Solution:
        """Solve (or its LP relaxation); ``starts`` are full column vectors given as MIP start hints."""
        h = self._highs(relax)
        h.setOptionValue("mip_rel_gap", mip_rel_gap)
        h.setOptionValue("time_limit", time_limit_s)
        h.setOptionValue("threads", threads)
        h.setOptionValue("random_seed", 0)
        t0 = time.perf_counter()
        with _quiet_stdout():
            for s in starts or []:
                sol = highspy.HighsSolution()
                sol.col_value = list(map(float, s))
                sol.value_valid = True
                h.setSolution(sol)
            h.run()
        dt = time.perf_counter() - t0
        st = h.getModelStatus()
        info = h.getInfo()
        has = info.primal_solution_status == 2  # kSolutionStatusFeasible
        if st == highspy.HighsModelStatus.kOptimal:
            status = "optimal"
        elif has:
            status = "feasible"
        elif st == highspy.HighsModelStatus.kInfeasible:
            status = "infeasible"
        else:
            status = h.modelStatusToString(st)
        vals = np.array(h.getSolution().col_value) if has or status == "optimal" else np.zeros(self.n_cols)
        gap = 0.0 if relax else float(info.mip_gap)
        return Solution(status=status, objective=float(info.objective_function_value), values=vals,
                        solve_s=dt, mip_gap=gap)
