"""Benchmark: concurrent streams through `exo-tui serve` (the openai client), and one stream
against the headless chat path on the same prompt.

Starts `exo-tui serve` in a subprocess on a free port, then for 1, 2, 4, 8 and 16 concurrent
streams prints the aggregate decode tok/s, each stream's time to first token (p50, p95) and the
ratio of the aggregate to one stream's. Then, in rounds that each start a new server and a new
process answering through `LocalBackend.generate` (what `exo-tui chat` runs), runs one API
stream (with the openai client, or read as plain SSE lines) between two headless answers, and
prints each stream's rate over the mean of its two neighbours', the median of those. Greedy
decoding: both paths produce the same tokens. With `--bare`, the same rounds, in turns, run
against a bare server with the model in its process too (`bare_child`; off by default, as it
doubles the one-stream rounds). Last, a server with no model replays a recorded answer
(`canned_child`): how much of the gap any server on this stack would have.

    .venv/bin/python bench/api.py [--model PATH] [--streams 1,2,4,8,16] [--max-tokens 64]
        [--repeats 5] [--one-rounds 8] [--bare]

`--model` takes a model folder, e.g. the 4-bit llama of Llama-3.2-1B's shape that
bench/cpu_kernels.py builds (its `q4` folder in the user cache); the default is the demo.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FLOOR_ROUNDS = 210  # answers of each kind against the canned server; the first 10 warm up
PROMPT = "hello, who are you and what can you do?"  # the demo answers it in text, at length


def child_env() -> dict[str, str]:
    """The environment of the processes the bench starts: this checkout, offline."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def start_server(model: str, streams: int) -> tuple[subprocess.Popen[str], str]:
    return serving(
        [sys.executable, "-m", "exo_tui.cli", "serve", "--model", model, "--port", "0",
         "--max-queue", str(max(16, streams))]
    )  # fmt: skip


def start_bare(model: str, max_tokens: int) -> tuple[subprocess.Popen[str], str]:
    return serving(
        [sys.executable, __file__, "--model", model, "--max-tokens", str(max_tokens),
         "--bare-child"]
    )  # fmt: skip


def serving(command: list[str]) -> tuple[subprocess.Popen[str], str]:
    """A server process started, and its URL (from its "on http://... " line)."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
        env=child_env(),
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        found = re.search(r"on (http://[^ ]+) ", line)
        if found:
            return process, found.group(1)
    raise SystemExit(f"{' '.join(command[1:3])} did not start (exit {process.wait()})")


async def one_stream(api: object, name: str, max_tokens: int) -> tuple[float, float, int]:
    """(seconds to the first text, seconds in all, completion tokens)."""
    from openai import AsyncOpenAI

    assert isinstance(api, AsyncOpenAI)
    started = time.perf_counter()
    first = 0.0
    tokens = 0
    stream = await api.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if not first and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return first, time.perf_counter() - started, tokens


async def round_of(api: object, name: str, streams: int, max_tokens: int) -> dict[str, float]:
    started = time.perf_counter()
    results = await asyncio.gather(*(one_stream(api, name, max_tokens) for _ in range(streams)))
    wall = time.perf_counter() - started
    ttfts = sorted(r[0] for r in results)
    tokens = sum(r[2] for r in results)
    return {
        "aggregate": tokens / wall,
        "p50": statistics.median(ttfts),
        "p95": ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
        "tokens": tokens,
        "one_stream_e2e": results[0][2] / results[0][1],
    }


def stream_body(name: str, max_tokens: int) -> dict[str, object]:
    """The bench's streamed chat request, as JSON."""
    return {
        "model": name,
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def raw_stream(client: object, url: str, name: str, max_tokens: int) -> float:
    """One stream read as SSE lines with httpx, no client parsing: tok/s, request to last."""
    import httpx

    assert isinstance(client, httpx.AsyncClient)
    body = stream_body(name, max_tokens)
    started = time.perf_counter()
    tokens = 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if '"usage"' in line:
                tokens = json.loads(line[len("data: ") :])["usage"]["completion_tokens"]
    return tokens / (time.perf_counter() - started)


async def recorded_answer(client: object, url: str, name: str, max_tokens: int) -> list[bytes]:
    """One streamed answer's body, as the pieces it came in."""
    import httpx

    assert isinstance(client, httpx.AsyncClient)
    body = stream_body(name, max_tokens)
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        return [piece async for piece in response.aiter_raw()]


def canned_child(recording: str) -> None:
    """A server on exo-tui's own stack (Starlette on uvicorn, its loop and settings, its
    streamed response) that answers every chat completion at once with the recorded pieces:
    no model, no validation, no template. What is left of a request's time is the stack's and
    the client's."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from exo_tui.api.server import ApiServer
    from exo_tui.api.streaming import Streamed

    pieces = [piece.encode("latin-1") for piece in json.loads(Path(recording).read_text())]

    async def body() -> AsyncGenerator[bytes]:
        for piece in pieces:
            yield piece

    async def answer(request: Request) -> Response:
        await request.body()
        return Streamed(body(), "text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", answer, methods=["POST"])])
    server = ApiServer(app, "127.0.0.1", 0, log_to_stderr=False)
    server.start()
    print(server.url, flush=True)
    sys.stdin.read()  # until the bench closes it (the server's thread ends with the process)


def client_floor(pieces: list[bytes], name: str, max_tokens: int) -> tuple[float, float]:
    """Seconds per answer, (the openai client, plain SSE lines), against `canned_child`
    replaying `pieces`: the least any server on this stack could add to an answer."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json") as recording:
        json.dump([piece.decode("latin-1") for piece in pieces], recording)
        recording.flush()
        child = subprocess.Popen(
            [sys.executable, __file__, "--canned-child", recording.name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env=child_env(),
        )  # fmt: skip
        assert child.stdin is not None and child.stdout is not None
        url = child.stdout.readline().strip()
        try:
            return asyncio.run(_floor(url, name, max_tokens))
        finally:
            child.stdin.close()
            child.wait(timeout=60)


async def _floor(url: str, name: str, max_tokens: int) -> tuple[float, float]:
    import httpx
    from openai import AsyncOpenAI

    api = AsyncOpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600)
    raw = httpx.AsyncClient(timeout=600)
    times: dict[str, list[float]] = {"api": [], "raw": []}
    for _ in range(FLOOR_ROUNDS):
        for kind in times:
            started = time.perf_counter()
            if kind == "api":
                await round_of(api, name, 1, max_tokens)
            else:
                await raw_stream(raw, url, name, max_tokens)
            times[kind].append(time.perf_counter() - started)
    await api.close()
    await raw.aclose()
    return statistics.median(times["api"][10:]), statistics.median(times["raw"][10:])


def headless_backend(model: str) -> object:
    from engine.loading import load_model, run_loading
    from engine.models.finding import resolve_model
    from exo_tui.chat.backend import LocalBackend

    return LocalBackend(run_loading(load_model(Path(resolve_model(model).path)), lambda _: None))


def headless(backend: object, max_tokens: int) -> tuple[float, int]:
    """(tok/s from the request to its last token, tokens) through LocalBackend in-process,
    what `exo-tui chat` runs."""
    from engine.types import ChatRequest, DoneChunk, Message
    from exo_tui.chat.backend import LocalBackend

    assert isinstance(backend, LocalBackend)
    request = ChatRequest(
        messages=(Message(role="user", content=PROMPT),), max_tokens=max_tokens, temperature=0
    )
    started = time.perf_counter()
    done = [c for c in backend.generate(request, None) if isinstance(c, DoneChunk)][-1]
    tokens = done.usage.completion_tokens
    return tokens / (time.perf_counter() - started), tokens


def headless_child(model: str, max_tokens: int) -> None:
    """The headless chat in a process of its own: one answer for each line read."""
    backend = headless_backend(model)
    headless(backend, max_tokens)  # warm-up
    print("ready", flush=True)
    for _ in sys.stdin:
        rate, tokens = headless(backend, max_tokens)
        print(rate, tokens, flush=True)


def bare_child(model: str, max_tokens: int) -> None:
    """A server that does little but pass the model's tokens on: exo-tui's uvicorn settings
    and a bare ASGI app (no Starlette, no validation, no queue, no types for the chunks) that
    answers any request with the bench's prompt. Its response starts at once; the tokens go
    out as pre-shaped SSE events, at most every STREAM_EVERY_S as exo-tui's streams do."""
    from engine.types import ChatRequest, DoneChunk, Message, TextChunk
    from exo_tui.api.inbox import Inbox
    from exo_tui.api.scheduler import STREAM_EVERY_S
    from exo_tui.api.server import ApiServer
    from exo_tui.chat.backend import LocalBackend

    backend = headless_backend(model)
    assert isinstance(backend, LocalBackend)
    request = ChatRequest(
        messages=(Message(role="user", content=PROMPT),), max_tokens=max_tokens, temperature=0
    )
    head = '{"id":"chatcmpl-bare","object":"chat.completion.chunk","created":0,"model":"m",'

    def event(choices: str, rest: str = "") -> bytes:
        return f'data: {head}"choices":[{choices}]{rest}}}\n\n'.encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        loop = asyncio.get_running_loop()
        inbox: Inbox[Any] = Inbox(loop)

        def deliver(chunk: object) -> None:
            inbox.put(chunk, last=isinstance(chunk, DoneChunk))

        backend.answer(request, threading.Event(), deliver)
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        out = event('{"index":0,"delta":{"role":"assistant","content":""}}')
        sent = 0.0
        while True:
            chunks = await inbox.take()
            if sent:
                await inbox.hold(sent + STREAM_EVERY_S - loop.time())
                chunks += inbox.take_ready()
            sent = loop.time()
            for chunk in chunks:
                if isinstance(chunk, TextChunk):
                    out += event(f'{{"index":0,"delta":{{"content":{json.dumps(chunk.text)}}}}}')
                elif isinstance(chunk, DoneChunk):
                    asked, said = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
                    out += event('{"index":0,"delta":{},"finish_reason":"stop"}')
                    out += event("", f',"usage":{{"prompt_tokens":{asked},"completion_tokens":'
                                     f'{said},"total_tokens":{asked + said}}}')  # fmt: skip
                    out += b"data: [DONE]\n\n"
                    await send({"type": "http.response.body", "body": out, "more_body": False})
                    return
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
            out = b""

    server = ApiServer(app, "127.0.0.1", 0, log_to_stderr=False)  # type: ignore[arg-type]
    server.start()
    print(f"on {server.url} ", flush=True)
    try:
        signal.pause()  # until the bench's SIGINT (`stop`)
    except KeyboardInterrupt:
        server.stop()


class HeadlessChat:
    """A `headless_child` process, answering when asked."""

    def __init__(self, model: str, max_tokens: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--model", model, "--max-tokens", str(max_tokens),
             "--headless-child"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env=child_env(),
        )  # fmt: skip
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            raise SystemExit(f"the headless chat did not start (exit {self.process.wait()})")

    def answer(self) -> tuple[float, int]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        rate, tokens = self.process.stdout.readline().split()
        return float(rate), int(tokens)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="a model name or folder (default demo)")
    parser.add_argument("--streams", default="1,2,4,8,16", help="concurrent streams per round")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--repeats", type=int, default=5, help="rounds of each size to take the median of"
    )
    parser.add_argument(
        "--one-rounds",
        type=int,
        default=8,
        help="rounds of one stream against the headless chat (each 4 streams, a new server)",
    )
    parser.add_argument("--headless-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--canned-child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--bare",
        action="store_true",
        help="one stream also against a bare server with the model (its rounds in turns)",
    )
    parser.add_argument("--bare-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.headless_child:
        headless_child(args.model, args.max_tokens)
        return
    if args.canned_child:
        canned_child(args.canned_child)
        return
    if args.bare_child:
        bare_child(args.model, args.max_tokens)
        return
    counts = [int(n) for n in args.streams.split(",")]

    from engine.models.finding import resolve_model

    name = resolve_model(args.model).name
    process, url = start_server(args.model, max(counts))
    try:
        asyncio.run(measure_streams(url, name, args, counts))
    finally:
        stop(process)
    # exo-tui's server, and with --bare a bare one (`bare_child`), in turns.
    servers: dict[str, Callable[[], tuple[subprocess.Popen[str], str]]] = {
        "exo-tui": lambda: start_server(args.model, 1)
    }
    if args.bare:
        servers["bare"] = lambda: start_bare(args.model, args.max_tokens)
    ratios = {server: {"api": list[float](), "raw": list[float]()} for server in servers}
    rates = {server: {"api": list[float](), "raw": list[float](), "chat": list[float]()}
             for server in servers}  # fmt: skip
    tokens = 0
    pieces: list[bytes] = []
    for _ in range(args.one_rounds):
        for server, start in servers.items():
            tokens = one_round_against_headless(
                args, name, ratios[server], rates[server], pieces, start
            )
    if not args.one_rounds:  # the streams alone
        return
    median = statistics.median
    mine = ratios["exo-tui"]
    print(f"one stream, request to last token ({tokens} tokens; {args.one_rounds} rounds, each "
          f"with a new server and a new headless chat process, every API stream between two "
          f"headless chats): headless chat {median(rates['exo-tui']['chat']):.1f} tok/s; "
          f"API with the openai client {median(rates['exo-tui']['api']):.1f} "
          f"({median(mine['api']):.2f}x its neighbours, median of {len(mine['api'])}; "
          f"quartiles {quartiles(mine['api'])}), read as plain SSE lines "
          f"{median(rates['exo-tui']['raw']):.1f} ({median(mine['raw']):.2f}x; "
          f"quartiles {quartiles(mine['raw'])})")  # fmt: skip
    if args.bare:
        bare = ratios["bare"]
        print(f"a bare server, the model in its process (an ASGI app on the same uvicorn, its "
              f"chunks pre-shaped, no validation, queue or types; measured the same way, in "
              f"turns): {median(bare['api']):.2f}x with the openai client (quartiles "
              f"{quartiles(bare['api'])}) and {median(bare['raw']):.2f}x as plain SSE lines "
              f"(quartiles {quartiles(bare['raw'])}); exo-tui's over the bare server's: "
              f"{median(mine['api']) / median(bare['api']):.3f} and "
              f"{median(mine['raw']) / median(bare['raw']):.3f}")  # fmt: skip
    rates = rates["exo-tui"]
    answer_s = tokens / median(rates["chat"])
    api_s, raw_s = client_floor(pieces, name, args.max_tokens)
    print(f"the floor: against a server on the same stack (Starlette on uvicorn) that answers at "
          f"once with a recorded answer ({len(pieces)} pieces), one answer takes "
          f"{api_s * 1000:.2f} ms with the openai client and {raw_s * 1000:.2f} ms read as "
          f"plain SSE lines: the most any server on it could reach against the headless "
          f"chat's {answer_s * 1000:.1f} ms answer is {answer_s / (answer_s + api_s):.3f}x and "
          f"{answer_s / (answer_s + raw_s):.3f}x")  # fmt: skip


def quartiles(values: list[float]) -> str:
    low, _, high = statistics.quantiles(values, n=4)
    return f"{low:.2f}-{high:.2f}"


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    process.wait(timeout=120)


async def measure_streams(url: str, name: str, args: argparse.Namespace, counts: list[int]) -> None:
    from openai import AsyncOpenAI

    # One client for every round, as an application keeps one: its connections are reused.
    api = AsyncOpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600)
    await round_of(api, name, 1, args.max_tokens)  # warm-up: compile, prompt cache
    print(f"model {name}, {args.max_tokens} tokens a stream at most, greedy, "
          f"the median of {args.repeats} rounds each, the counts in turns")  # fmt: skip
    print(f"{'streams':>7} {'tok/s':>9} {'x one':>6} {'TTFT p50':>9} {'TTFT p95':>9}")
    # The stream counts take turns, round after round: this machine's speed drifts over
    # minutes (a shared host), and counts measured one after the other would carry the drift
    # into their ratios.
    rounds: dict[int, list[dict[str, float]]] = {count: [] for count in counts}
    for _ in range(args.repeats):
        for count in counts:
            rounds[count].append(await round_of(api, name, count, args.max_tokens))
    base = 0.0
    for count in counts:
        result = sorted(rounds[count], key=lambda r: r["aggregate"])[len(rounds[count]) // 2]
        base = base or result["aggregate"] if count == 1 else base
        ratio = f"{result['aggregate'] / base:>6.2f}" if base else f"{'':>6}"
        print(f"{count:>7} {result['aggregate']:>9.1f} {ratio} "
              f"{result['p50'] * 1000:>7.0f}ms {result['p95'] * 1000:>7.0f}ms")  # fmt: skip
    await api.close()


def one_round_against_headless(
    args: argparse.Namespace,
    name: str,
    ratios: dict[str, list[float]],
    rates: dict[str, list[float]],
    pieces: list[bytes],
    start: Callable[[], tuple[subprocess.Popen[str], str]],
) -> int:
    """One stream through a new server against the headless chat in a new process: each API
    stream between two headless answers, its ratio to their mean. Both sides run in processes
    of their own, new each round: on this machine one process decodes up to a tenth faster
    than another with the same code (where its memory landed), and a ratio of two processes
    taken once would carry that. The speed drifts over minutes too: neighbours carry little of
    it."""
    process, url = start()
    chat = HeadlessChat(args.model, args.max_tokens)
    try:
        return asyncio.run(_one_round(url, name, args.max_tokens, chat, ratios, rates, pieces))
    finally:
        chat.close()
        stop(process)


async def _one_round(
    url: str,
    name: str,
    max_tokens: int,
    chat: HeadlessChat,
    ratios: dict[str, list[float]],
    rates: dict[str, list[float]],
    pieces: list[bytes],
) -> int:
    """(`pieces`: filled with one answer's body as it came, the first time.)"""
    import httpx
    from openai import AsyncOpenAI

    api = AsyncOpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600)
    raw = httpx.AsyncClient(timeout=600)
    await round_of(api, name, 1, max_tokens)  # warm-up
    await raw_stream(raw, url, name, max_tokens)
    if not pieces:
        pieces.extend(await recorded_answer(raw, url, name, max_tokens))
    before, tokens = chat.answer()
    for kind in ("api", "raw", "api", "raw"):
        if kind == "api":
            rate = (await round_of(api, name, 1, max_tokens))["one_stream_e2e"]
        else:
            rate = await raw_stream(raw, url, name, max_tokens)
        after, tokens = chat.answer()
        rates[kind].append(rate)
        rates["chat"].append(after)
        ratios[kind].append(rate / ((before + after) / 2))
        before = after
    await api.close()
    await raw.aclose()
    return tokens


if __name__ == "__main__":
    main()
