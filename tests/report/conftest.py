"""Fixtures for the report tests (inputs built in report_inputs)."""

from __future__ import annotations

import pytest
from report_inputs import toy_graph, toy_plan

from tessera.contracts.plan import Plan
from tessera.graph import KernelGraph


@pytest.fixture
def graph() -> KernelGraph:
    return toy_graph()


@pytest.fixture
def plan() -> Plan:
    return toy_plan()
