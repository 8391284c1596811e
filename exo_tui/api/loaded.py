"""Which loaded model answers a request: the names a model goes by, 404 and 503."""

from __future__ import annotations

from collections.abc import Callable

from exo_tui.api.errors import ApiError
from exo_tui.chat.backend import Backend

# The TUI loads and unloads models, so the server asks for the backend on every request.
BackendGetter = Callable[[], "Backend | None"]


def model_names(backend: Backend) -> tuple[str, ...]:
    """The card's name, and for a hub repo its last part: "mlx-community/Qwen3-4B-4bit" is also
    "Qwen3-4B-4bit". Clients that speak Ollama add ":latest"; `matches` allows it."""
    name = backend.card.name
    short = name.rsplit("/", 1)[-1]
    return (name,) if short == name else (name, short)


def matches(backend: Backend, wanted: str) -> bool:
    wanted = wanted.strip().lower().removesuffix(":latest")
    return any(wanted == name.lower() for name in model_names(backend))


def current(get_backend: BackendGetter) -> Backend:
    backend = get_backend()
    if backend is None:
        raise ApiError(
            503,
            "No model is loaded. Load one in exo-tui, or start the server with "
            "`exo-tui serve --model NAME`",
            "service_unavailable",
        )
    return backend


def backend_for(get_backend: BackendGetter, wanted: str) -> Backend:
    """The loaded backend if `wanted` names it; else 404 listing what is loaded."""
    backend = current(get_backend)
    if not matches(backend, wanted):
        raise ApiError(
            404,
            f"The model {wanted!r} is not loaded (loaded: {backend.card.name}). "
            f"Ask for {backend.card.name!r}, or load {wanted!r} first",
            "not_found_error",
            param="model",
        )
    return backend
