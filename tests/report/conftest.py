"""Fixtures for the report tests (inputs built in report_inputs)."""

from __future__ import annotations

import pytest
from report_inputs import toy_graph, toy_plan

from tessera.graph import KernelGraph
from tessera.plan.types import Plan


@pytest.fixture
def graph() -> KernelGraph:
    return toy_graph()


@pytest.fixture
def plan() -> Plan:
    return toy_plan()
