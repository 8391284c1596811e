"""Built-in tools: a calculator that parses instead of eval-ing, the clock, cluster_status."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from engine.kv_memory import format_bytes
from exo_tui.chat.tools import (
    BUILTIN_TOOLS,
    Tool,
    ToolError,
    ToolRegistry,
    builtin_registry,
    calculate,
    local_cluster_status,
)
from exo_tui.cluster.control.state import ClusterState, NodeSeen, NodeStats, apply
from exo_tui.cluster.this_machine import cluster_summary


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12 * 34", 408),
        ("12 × 34", 408),
        ("7 / 2", 3.5),
        ("2 ^ 10", 1024),
        ("-(3 + 4) * 2", -14),
        ("sqrt(16) + abs(-2)", 6),
        ("10 % 4", 2),
        ("120 / 4", 30),
    ],
)
def test_calculator_values(expression: str, value: float) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "unsupported"),
        ("(1).__class__", "unsupported"),
        ("x + 1", "unsupported"),
        ("1 / 0", "division by zero"),
        ("2 ** 100000", "too large"),
        ("12 *", "not an arithmetic expression"),
        ("", "empty"),
    ],
)
def test_calculator_refuses(expression: str, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        calculate(expression)


def test_registry_runs_tools_and_reports_failures() -> None:
    def boom(arguments: Mapping[str, Any]) -> str:
        raise ValueError("the tool broke")

    registry = ToolRegistry([Tool(BUILTIN_TOOLS[0], boom)])
    assert registry.run("calculator", {"expression": "1"}) == (
        "error: ValueError: the tool broke",
        False,
    )
    content, ok = registry.run("nope", {})
    assert not ok and "no tool named 'nope'" in content


def test_builtin_calculator_checks_its_arguments() -> None:
    registry = builtin_registry(lambda: {})
    assert registry.run("calculator", {"expression": "6*7"}) == ("42", True)
    content, ok = registry.run("calculator", {"expr": "6*7"})
    assert not ok and "expression" in content
    clock, ok = registry.run("clock", {})
    assert ok and any(str(year) in clock for year in range(2024, 2100))


def test_cluster_status_reads_the_live_state() -> None:
    stats = NodeStats(
        node_id="a",
        name="studio",
        backend="metal",
        blas="accelerate",
        memory_total_bytes=64 * 2**30,
        memory_available_bytes=40 * 2**30,
    )  # 68.7 and 42.9 GB: one unit, the decimal GB the node panel shows too
    state = apply(ClusterState(), NodeSeen(stats=stats, at=0.0))
    registry = builtin_registry(lambda: cluster_summary(state, "demo"))
    content, ok = registry.run("cluster_status", {})
    assert ok
    status = json.loads(content)
    assert status["nodes"][0]["name"] == "studio"
    assert status["total_memory_gb"] == 68.7
    assert status["available_memory_gb"] == 42.9
    assert format_bytes(stats.memory_total_bytes) == "68.7 GB"
    assert status["model"] == "demo"


def test_local_cluster_status_is_this_machine() -> None:
    status = local_cluster_status("demo")
    assert len(status["nodes"]) == 1
    assert status["total_memory_gb"] > 0
