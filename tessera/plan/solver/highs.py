"""A thin named-model builder over HiGHS (highspy): columns and rows collected in Python, passed in bulk.

Every column and row carries a name (the formulation's symbol plus its indices, e.g. ``x[12,1]``) so that
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
from dataclasses import dataclass, replace

import highspy
import numpy as np

INF = math.inf
# Objectives are seconds and their tie-breaks ~1e-9 s; HiGHS's tolerances are absolute (dual feasibility
# 1e-7), so solutions 1e-8 s apart looked equal and "optimal" was not. HiGHS sees the objective in
# microseconds; Solution.objective is reported back in the model's units.
OBJ_SCALE = 1e6
INFEASIBLE = ("infeasible", "Primal infeasible or unbounded")  # HiGHS's status texts for "does not fit"


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
        if isinstance(terms, dict):  # keys already unique
            acc = terms
        else:
            acc = {}
            for j, a in terms:
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
        h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(self.col_cost, dtype=float) * OBJ_SCALE)
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
              starts: list[np.ndarray] | None = None, threads: int = 1, max_nodes: int | None = None) -> Solution:
        """Solve (or its LP relaxation); ``starts`` are full column vectors given as MIP start hints;
        ``max_nodes``: stop branch and bound after that many nodes (1: the root only) with the incumbent,
        "feasible" when the gap is not met by then (None: no limit)."""
        h = self._highs(relax)
        _options(h, mip_rel_gap, time_limit_s, threads)
        if max_nodes is not None:
            h.setOptionValue("mip_max_nodes", max_nodes)
        return _run(h, self.n_cols, relax, starts)

    def resolver(self, *, time_limit_s: float = 60.0) -> Resolver:
        """This model, re-solved under other objective vectors (a cost sweep): the rows are passed to HiGHS
        once instead of once per sweep point."""
        return Resolver(self, time_limit_s)


class Resolver:
    """Solves the LP relaxation first and keeps it when every integer column comes out integral (the
    two-device placement LP is a cut problem and usually is); otherwise the MILP. Either way the answer
    is an optimal integer solution of the model."""

    def __init__(self, model: Model, time_limit_s: float) -> None:
        self._model, self._limit = model, time_limit_s
        self._ints = np.array([j for j, i in enumerate(model.col_int) if i], dtype=np.int64)
        self._lp = model._highs(True)
        _options(self._lp, 0.0, time_limit_s, 1)
        self._mip: highspy.Highs | None = None

    def solve(self, costs: np.ndarray) -> Solution:
        n = self._model.n_cols
        assert costs.shape == (n,), (costs.shape, n)
        sol = self._run(self._lp, costs, relax=True)
        if sol.status == "optimal":
            v = sol.values[self._ints]
            if np.all(np.minimum(np.abs(v), np.abs(v - 1.0)) <= 1e-9):
                return replace(sol, values=np.where(np.isin(np.arange(n), self._ints), np.round(sol.values),
                                                    sol.values))
        if self._mip is None:
            self._mip = self._model._highs(False)
            _options(self._mip, 0.0, self._limit, 1)
        return self._run(self._mip, costs, relax=False)

    def _run(self, h: highspy.Highs, costs: np.ndarray, *, relax: bool) -> Solution:
        if not relax:
            h.clearSolver()  # forget the previous point's incumbent (an LP keeps its basis: a warm start)
        n = self._model.n_cols
        h.setOptionValue("time_limit", h.getRunTime() + self._limit)  # HiGHS's limit counts all runs so far
        h.changeColsCost(n, np.arange(n, dtype=np.int32), costs.astype(float) * OBJ_SCALE)
        return _run(h, n, relax, None)


def _options(h: highspy.Highs, mip_rel_gap: float, time_limit_s: float, threads: int) -> None:
    h.setOptionValue("mip_rel_gap", mip_rel_gap)
    # objectives are seconds (1e-5 .. 1e1): HiGHS's default absolute gap of 1e-6 would stop a 100 µs
    # step 1% from its optimum, so only the relative gap decides
    h.setOptionValue("mip_abs_gap", 0.0)
    h.setOptionValue("time_limit", time_limit_s)
    h.setOptionValue("threads", threads)
    h.setOptionValue("random_seed", 0)


def _run(h: highspy.Highs, n_cols: int, relax: bool, starts: list[np.ndarray] | None) -> Solution:
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
    vals = np.array(h.getSolution().col_value) if has or status == "optimal" else np.zeros(n_cols)
    gap = 0.0 if relax else float(info.mip_gap)
    return Solution(status=status, objective=float(info.objective_function_value) / OBJ_SCALE, values=vals,
                    solve_s=dt, mip_gap=gap)
