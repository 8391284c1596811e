"""`exo-tui serve`: load a model, here or across the cluster, and serve the OpenAI and Ollama
APIs on it until Ctrl+C."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from engine.errors import EngineError
from engine.mlx_threads import GIL_SWITCH_INTERVAL_S
from engine.types import ModelReady
from exo_tui.api.board import RequestBoard
from exo_tui.api.server import ApiServer, build_app, require_key_off_loopback
from exo_tui.chat.backend import Backend
from exo_tui.commands.chat import chat_card, default_model_spec, downloaded
from exo_tui.commands.printing import TextOutput

if TYPE_CHECKING:
    from exo_tui.cluster.node import ClusterSetup


def run_serve(args: argparse.Namespace, cluster: ClusterSetup | None = None) -> int:
    require_key_off_loopback(args.host, args.api_key)
    if cluster is not None and args.max_batch is not None:
        raise EngineError(
            "--max-batch sets how many requests this machine's model decodes together, and a "
            "model placed across the cluster answers one request at a time",
            "Leave out --max-batch, or serve with --no-cluster",
        )
    # The model's thread needs the GIL for a moment every step, between computations that run
    # without it; at Python's default it waits out the server's threads (as the TUI's does).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    card = chat_card(args.model or default_model_spec(args.models_dir), args.models_dir)
    if cluster is None and card.source == "hf_cache":
        card = downloaded(card, as_json=False)
    out = TextOutput(card)
    # Ctrl+C stops it, even started in the background (where a shell ignores SIGINT), and
    # `kill` as Ctrl+C does: the model is unloaded, on every node.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    try:
        if cluster is not None:
            from exo_tui.commands.cluster_chat import run_on_cluster

            return run_on_cluster(
                args, cluster, card, out, lambda backend: _serve_async(backend, args)
            )
        return _serve_here(args, card.path, out)
    except KeyboardInterrupt:
        return 0


def _serve_here(args: argparse.Namespace, path: str, out: TextOutput) -> int:
    from engine.batching import DEFAULT_BATCH
    from engine.loading import load_model, run_loading
    from exo_tui.chat.backend import LocalBackend

    started = time.perf_counter()
    loaded = run_loading(load_model(Path(path)), out.progress)
    out.loaded(
        ModelReady(
            model=loaded.card.name,
            load_seconds=time.perf_counter() - started,
            blas=loaded.blas,
            kernels=loaded.kernels,
        )
    )
    backend = LocalBackend(loaded, args.max_batch or DEFAULT_BATCH)
    server = start_server(backend, args)
    try:
        threading.Event().wait()  # until Ctrl+C
    finally:
        server.stop()
        backend.unload()
    return 0


async def _serve_async(backend: Backend, args: argparse.Namespace) -> int:
    """On the cluster's loop: serve until cancelled (Ctrl+C), then stop off the loop, which
    the answers still running need until they end."""
    server = start_server(backend, args)
    try:
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(server.stop)
    return 0


def start_server(backend: Backend, args: argparse.Namespace) -> ApiServer:
    app = build_app(
        lambda: backend, RequestBoard(), api_key=args.api_key, max_waiting=args.max_queue
    )
    try:
        server = ApiServer(app, args.host, args.api_port)
    except OSError as error:
        raise EngineError(str(error), "Choose another --port, or stop what listens there") from None
    server.start()
    print(
        f"Serving {backend.card.name} on {server.url} (OpenAI: {server.url}/v1, "
        f"Ollama: {server.url}). Ctrl+C stops.",
        flush=True,
    )
    return server
