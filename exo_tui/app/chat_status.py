"""What the chat says of the model: its border (`demo · ready`) and, while empty, what to do."""

from __future__ import annotations

from exo_tui.app.keys import shown
from exo_tui.cluster.control.state import ClusterState, RunnerLoading

# Questions the bundled tools answer: the calculator, the clock and the cluster's status.
EXAMPLES = (
    "What is 17 * 23?",
    "What time is it?",
    "How much memory does the cluster have free?",
)


def model_state(state: ClusterState, answering: bool, prefilling: bool = False) -> str:
    """`not loaded`, `loading 5/16`, `ready`, `prefilling`, `answering`, `failed`."""
    status = state.instance_status
    if status is None or status == "placed":
        return "not loaded"
    if status == "loading":
        loading = [n.runner for n in state.nodes if isinstance(n.runner, RunnerLoading)]
        done = sum(r.layers_loaded for r in loading)
        total = sum(r.layers_total for r in loading)
        return f"loading {done}/{total}" if total else "loading"
    if answering and prefilling:
        return "prefilling"
    if answering or status == "generating":
        return "answering"
    return status


def chat_title(
    model: str | None, state: ClusterState, answering: bool, prefilling: bool = False
) -> str:
    if model is None:
        return "Chat"
    return f"Chat · {model} · {model_state(state, answering, prefilling)}"


def empty_hint(model: str | None, state: ClusterState) -> str:
    """What an empty chat tells a newcomer to do next."""
    if model is None:
        return f"No model chosen: {shown('app.pick_model')} picks one."
    status = state.instance_status
    if status in ("ready", "generating"):
        questions = "\n".join(f"  · {question}" for question in EXAMPLES)
        return f"{model} is ready. Ask anything, or try one that uses its tools:\n{questions}"
    if status == "loading":
        return f"{model} is loading…"
    if status == "failed":
        return f"{model} failed to load: {shown('app.launch')} tries again."
    return f"{model} is not loaded: {shown('app.launch')} loads it."
