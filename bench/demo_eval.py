"""Evaluate the bundled demo model on held-out phrasings (`demo_model/corpus.py`).

    .venv/bin/python bench/demo_eval.py [--model PATH] [--count 200] [--json]

For each held-out prompt, greedy, with the built-in tools offered:
- right tool: the first tool call names the tool the question needs (tool questions);
- no needless tool: chat questions get text and no tool call;
- valid arguments: tool calls whose arguments are a JSON object matching the tool's schema
  (a call the parser rejects as invalid JSON counts as invalid);
- exact expression: calculator calls whose expression is the intended one (spacing ignored);
- answer uses result: the real tool is run on the model's arguments, its result fed back as a
  `tool` message, and the answer must contain the result (calculator: the number; clock: HH:MM;
  cluster_status: the total memory, a node name or the model, depending on the question);
- decode tok/s: median over generations of at least 8 tokens.
Targets: right tool >= 90 %, valid arguments >= 98 %, answer uses result >= 90 %.

`cluster_status` reports this machine's memory, but its node under a name never used in
training (a different one per prompt, from `demo_model.corpus.HELDOUT_NODE_NAMES`, which the
training corpus never produces), so the figures do not depend on the machine's hostname;
`--live-name` keeps the hostname instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import engine  # noqa: E402, F401  (OpenBLAS before mlx)
from demo_model.corpus import HELDOUT_NODE_NAMES, EvalPrompt, heldout_prompts  # noqa: E402
from engine.errors import RequestError  # noqa: E402
from engine.generate import generate  # noqa: E402
from engine.loading import LoadedModel, load_model_sync  # noqa: E402
from engine.models.locations import bundled_demo_dir  # noqa: E402
from engine.types import (  # noqa: E402
    ChatRequest,
    DoneChunk,
    ErrorChunk,
    Message,
    TextChunk,
    ToolCall,
    ToolCallChunk,
    ToolSpec,
)
from exo_tui.chat.tools import BUILTIN_TOOLS, builtin_registry, local_cluster_status  # noqa: E402

TARGETS = {"right_tool": 0.90, "valid_arguments": 0.98, "answer_uses_result": 0.90}
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "number": (int, float),
    "integer": int,
    "boolean": bool,
    "object": dict,
    "array": list,
}


def matches_schema(arguments: object, schema: dict[str, Any]) -> bool:
    """The subset of JSON Schema the built-in tools use: object, properties, types, required."""
    if not isinstance(arguments, dict):
        return False
    properties: dict[str, Any] = schema.get("properties", {})
    if any(key not in arguments for key in schema.get("required", [])):
        return False
    for key, value in arguments.items():
        if key not in properties:
            return False  # the model invented an argument
        expected = _JSON_TYPES.get(properties[key].get("type", ""), object)
        if not isinstance(value, expected):
            return False
    return True


def run(loaded: LoadedModel, messages: list[Message], max_tokens: int) -> dict[str, Any]:
    request = ChatRequest(
        messages=tuple(messages), tools=BUILTIN_TOOLS, max_tokens=max_tokens, temperature=0.0
    )
    text: list[str] = []
    calls: list[ToolCallChunk] = []
    errors: list[str] = []
    done: DoneChunk | None = None
    for chunk in generate(loaded, request):
        if isinstance(chunk, TextChunk):
            text.append(chunk.text)
        elif isinstance(chunk, ToolCallChunk):
            calls.append(chunk)
        elif isinstance(chunk, ErrorChunk):
            errors.append(chunk.message)
        elif isinstance(chunk, DoneChunk):
            done = chunk
    assert done is not None
    return {"text": "".join(text).strip(), "calls": calls, "errors": errors, "done": done}


def expected_in_answer(prompt: EvalPrompt, call: ToolCallChunk, result: str, ok: bool) -> str:
    if not ok:
        return result.removeprefix("error: ")
    if call.name == "calculator":
        return result
    if call.name == "clock":
        return result.split(", ")[-1].split(" ")[0]  # HH:MM
    status = json.loads(result)
    if prompt.aspect == "nodes":
        return str(status["nodes"][0]["name"])
    if prompt.aspect == "model":
        return str(status["model"]) if status["model"] else "No model"
    return str(status["total_memory_gb"])


def evaluate(
    loaded: LoadedModel, prompts: list[EvalPrompt], verbose: bool, live_name: bool = False
) -> dict[str, Any]:
    asked = 0

    def status() -> dict[str, Any]:
        found = local_cluster_status("demo")
        if not live_name:
            name = HELDOUT_NODE_NAMES[asked % len(HELDOUT_NODE_NAMES)]
            found["nodes"] = [{**node, "name": name} for node in found["nodes"]]
        return found

    registry = builtin_registry(status)
    specs: dict[str, ToolSpec] = {t.name: t for t in BUILTIN_TOOLS}
    counts = dict.fromkeys(
        ["tool_prompts", "right_tool", "chat_prompts", "no_needless_tool", "calls", "valid",
         "calculator_calls", "exact_expression", "answers", "answer_uses_result"],
        0,
    )  # fmt: skip
    speeds: list[float] = []
    failures: list[str] = []
    for prompt in prompts:
        asked += 1
        first = run(loaded, [Message(role="user", content=prompt.prompt)], 96)
        calls: list[ToolCallChunk] = first["calls"]
        done: DoneChunk = first["done"]
        if done.usage.completion_tokens >= 8:
            speeds.append(done.stats.decode_tps)
        invalid = [e for e in first["errors"] if "tool call" in e or "arguments" in e]
        counts["calls"] += len(calls) + len(invalid)
        counts["valid"] += sum(
            matches_schema(c.arguments, specs[c.name].parameters) for c in calls if c.name in specs
        )  # noqa: E501
        if prompt.tool is None:
            counts["chat_prompts"] += 1
            counts["no_needless_tool"] += not calls and not invalid
            if calls or invalid:
                failures.append(f"needless tool: {prompt.prompt!r} -> {calls or invalid}")
            continue
        counts["tool_prompts"] += 1
        right = bool(calls) and calls[0].name == prompt.tool
        counts["right_tool"] += right
        if not right:
            failures.append(f"wrong tool: {prompt.prompt!r} -> {calls or first['text']!r}")
            continue
        call = calls[0]
        if call.name == "calculator":
            counts["calculator_calls"] += 1
            got = str(call.arguments.get("expression", "")).replace(" ", "")
            exact = got == prompt.expression.replace(" ", "")
            counts["exact_expression"] += exact
            if not exact:
                failures.append(f"expression: {prompt.prompt!r} -> {got!r}")
        if not matches_schema(call.arguments, specs[call.name].parameters):
            continue
        result, ok = registry.run(call.name, call.arguments)
        history = [
            Message(role="user", content=prompt.prompt),
            Message(
                role="assistant",
                content=first["text"],
                tool_calls=(ToolCall(id=call.id, name=call.name, arguments=call.arguments),),
            ),
            Message(role="tool", content=result, tool_call_id=call.id, name=call.name),
        ]
        try:
            second = run(loaded, history, 128)
        except RequestError as error:  # e.g. a result too long for the context
            counts["answers"] += 1
            failures.append(f"answer: {prompt.prompt!r} -> {error}")
            continue
        second_done: DoneChunk = second["done"]
        if second_done.usage.completion_tokens >= 8:
            speeds.append(second_done.stats.decode_tps)
        expected = expected_in_answer(prompt, call, result, ok)
        counts["answers"] += 1
        uses = expected in second["text"]
        counts["answer_uses_result"] += uses
        if not uses:
            failures.append(f"answer: {prompt.prompt!r} {result[:60]!r} -> {second['text']!r}")
    if verbose:
        for line in failures:
            print("  " + line)

    def share(part: str, whole: str) -> float:
        return counts[part] / counts[whole] if counts[whole] else 0.0

    return {
        "prompts": len(prompts),
        "right_tool": share("right_tool", "tool_prompts"),
        "no_needless_tool": share("no_needless_tool", "chat_prompts"),
        "valid_arguments": share("valid", "calls"),
        "exact_expression": share("exact_expression", "calculator_calls"),
        "answer_uses_result": share("answer_uses_result", "answers"),
        "decode_tps": statistics.median(speeds) if speeds else 0.0,
        "counts": counts,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=bundled_demo_dir())
    parser.add_argument("--count", type=int, default=200, help="held-out prompts")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--verbose", action="store_true", help="print every failure")
    parser.add_argument(
        "--live-name", action="store_true", help="cluster_status names the node by this hostname"
    )
    args = parser.parse_args()
    loaded = load_model_sync(args.model)
    started = time.perf_counter()
    figures = evaluate(loaded, heldout_prompts(args.count), args.verbose, args.live_name)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(figures))
        return 0
    c = figures["counts"]
    rows = [
        ("right tool", figures["right_tool"], f"{c['right_tool']}/{c['tool_prompts']}", "≥ 90 %"),
        ("valid arguments", figures["valid_arguments"], f"{c['valid']}/{c['calls']}", "≥ 98 %"),
        ("answer uses result", figures["answer_uses_result"],
         f"{c['answer_uses_result']}/{c['answers']}", "≥ 90 %"),
        ("no needless tool call", figures["no_needless_tool"],
         f"{c['no_needless_tool']}/{c['chat_prompts']}", ""),
        ("exact calculator expression", figures["exact_expression"],
         f"{c['exact_expression']}/{c['calculator_calls']}", ""),
    ]  # fmt: skip
    print("| measure | share | count | target |\n|---|---|---|---|")
    for name, value, count, target in rows:
        print(f"| {name} | {value * 100:.1f} % | {count} | {target} |")
    print(f"| decode | {figures['decode_tps']:.0f} tok/s | median | |")
    print(f"\n{figures['prompts']} held-out prompts in {figures['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
