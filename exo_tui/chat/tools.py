"""Built-in tools the model may call: a safe calculator, the clock and the cluster's status.

Each tool is a JSON schema (what the chat template shows the model) and a Python function. A
failing tool returns its error as the result, so the model and the user both see what went wrong.
"""

from __future__ import annotations

import ast
import datetime
import json
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.types import ToolSpec

CALCULATOR = ToolSpec(
    name="calculator",
    description="Evaluate an arithmetic expression and return the number.",
    parameters={
        "type": "object",
        "properties": {
            "expression": {"type": "string", "description": "e.g. 12 * (3 + 4) / 2"},
        },
        "required": ["expression"],
    },
)
CLOCK = ToolSpec(
    name="clock",
    description="The current local date and time.",
    parameters={"type": "object", "properties": {}},
)
CLUSTER_STATUS = ToolSpec(
    name="cluster_status",
    description="The nodes of the cluster, their memory, and the loaded model.",
    parameters={"type": "object", "properties": {}},
)
BUILTIN_TOOLS = (CALCULATOR, CLOCK, CLUSTER_STATUS)


class ToolError(Exception):
    """A tool could not do what was asked; the message goes back to the model."""


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
}
_MAX_POWER = 1000


def calculate(expression: str) -> int | float:
    """Evaluate arithmetic from a parsed syntax tree; names, attributes and calls are refused."""
    text = expression.replace("×", "*").replace("÷", "/").replace("^", "**").strip()
    if not text:
        raise ToolError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from error
    try:
        value = _evaluate(tree.body)
    except ZeroDivisionError as error:
        raise ToolError("division by zero") from error
    except OverflowError as error:
        raise ToolError("the result is too large") from error
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_POWER:
            raise ToolError(f"exponent {right} is too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        return _FUNCTIONS[node.func.id](*(_evaluate(arg) for arg in node.args))
    raise ToolError(f"unsupported in an expression: {ast.unparse(node)!r}")


def now_text(now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now().astimezone()
    return now.strftime("%A %d %B %Y, %H:%M %Z").strip()


ToolFunction = Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    run: ToolFunction


def _run_calculator(arguments: Mapping[str, Any]) -> str:
    expression = arguments.get("expression")
    if not isinstance(expression, str):
        raise ToolError("calculator needs an 'expression' string")
    return str(calculate(expression))


def _run_clock(arguments: Mapping[str, Any]) -> str:
    return now_text()


class ToolRegistry:
    """The tools offered to the model, by name."""

    def __init__(self, tools: list[Tool]) -> None:
        self._tools = {tool.spec.name: tool for tool in tools}

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(tool.spec for tool in self._tools.values())

    def run(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, bool]:
        """The tool's result text and whether it succeeded; an error is a result too."""
        tool = self._tools.get(name)
        if tool is None:
            return f"error: no tool named {name!r} (tools: {', '.join(self._tools)})", False
        try:
            return tool.run(arguments), True
        except ToolError as error:
            return f"error: {error}", False
        except (TypeError, ValueError, ArithmeticError) as error:
            return f"error: {type(error).__name__}: {error}", False


def local_cluster_status(model: str | None) -> dict[str, Any]:
    """The status of a one-node cluster (this machine), as `cluster_status` returns it."""
    from exo_tui.cluster.control.state import ClusterState, NodeSeen, apply
    from exo_tui.cluster.this_machine import cluster_summary, local_node_stats

    state = apply(ClusterState(), NodeSeen(stats=local_node_stats(), at=0.0))
    return cluster_summary(state, model)


def builtin_registry(cluster_status: Callable[[], Mapping[str, Any]]) -> ToolRegistry:
    """The built-in tools; `cluster_status` reads the live cluster state when called."""

    def run_cluster_status(arguments: Mapping[str, Any]) -> str:
        return json.dumps(cluster_status())

    return ToolRegistry(
        [
            Tool(CALCULATOR, _run_calculator),
            Tool(CLOCK, _run_clock),
            Tool(CLUSTER_STATUS, run_cluster_status),
        ]
    )
