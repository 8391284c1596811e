"""Several requests at once: they queue FIFO behind the model's slots, their first chunk says
where they wait, a client that goes frees its slot, and the board shows it all."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from exo_tui.api import scheduler
from exo_tui.chat.backend import LocalBackend
from tests.api.conftest import HeldBackend, PacedBackend, Serve, Served

HELLO = {"model": "demo", "messages": [{"role": "user", "content": "hello"}], "temperature": 0}


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def sse_events(response: httpx.Response) -> list[dict[str, object]]:
    return [
        json.loads(line[len("data: ") :])
        for line in response.iter_lines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def test_queued_streams_say_their_place_and_answer_as_alone(
    serve: Serve, demo_backend: LocalBackend
) -> None:
    alone = httpx.post(
        f"{serve(demo_backend).url}/v1/chat/completions", json={**HELLO, "max_tokens": 30}
    ).json()["choices"][0]["message"]["content"]
    held = HeldBackend(demo_backend, concurrency=1)  # one slot: the rest queue
    served = serve(held)
    url = served.url
    results: dict[str, list[dict[str, object]]] = {}

    def stream(name: str, api: str) -> None:
        if api == "openai":
            body = {**HELLO, "max_tokens": 30, "stream": True}
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
                results[name] = sse_events(r)
        else:
            body = {**HELLO, "options": {"temperature": 0, "num_predict": 30}}
            with httpx.stream("POST", f"{url}/api/chat", json=body, timeout=60) as r:
                results[name] = [json.loads(line) for line in r.iter_lines() if line]

    first = threading.Thread(target=stream, args=("first", "openai"))
    first.start()
    assert held.started.acquire(timeout=30)  # the first holds the one slot
    second = threading.Thread(target=stream, args=("second", "openai"))
    second.start()
    wait_until(lambda: served.scheduler.waiting == 1)
    third = threading.Thread(target=stream, args=("third", "ollama"))
    third.start()
    wait_until(lambda: served.scheduler.waiting == 2)
    board = {r.id: r for r in served.board.snapshot()}
    assert [(r.state, r.queue_position) for r in board.values()] == [
        ("prefilling", None),
        ("queued", 1),
        ("queued", 2),
    ]
    held.go.set()
    for thread in (first, second, third):
        thread.join(60)
    assert "queue_position" not in results["first"][0]
    assert results["second"][0]["queue_position"] == 1
    assert results["third"][0]["queue_position"] == 2

    def openai_text(events: list[dict[str, object]]) -> str:
        return "".join(
            c["delta"].get("content") or ""  # type: ignore[index,union-attr]
            for e in events
            for c in e["choices"]  # type: ignore[union-attr]
        )

    assert openai_text(results["first"]) == alone == openai_text(results["second"])
    assert "".join(line["message"]["content"] for line in results["third"]) == alone  # type: ignore[index]
    assert [r.state for r in served.board.snapshot()] == ["done"] * 3


@pytest.mark.parametrize("api", ["openai", "ollama"])
def test_a_client_that_goes_frees_its_slot(
    serve: Serve, tiny_backend: LocalBackend, api: str
) -> None:
    """The tiny model's greedy answer to "hi" runs to max_tokens: only the disconnect stops it
    (long before the 1900 tokens at 100 a second), on either API's stream."""
    served = serve(PacedBackend(tiny_backend, 0.01))
    name = tiny_backend.card.name
    body = {
        "model": name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1900,
        "temperature": 0,  # sampled, its random weights can pick an end of turn
    }
    path, streamed = "/v1/chat/completions", {**body, "stream": True}
    if api == "ollama":
        path = "/api/chat"
        streamed = {**body, "stream": True, "options": {"temperature": 0, "num_predict": 1900}}
    with httpx.stream("POST", f"{served.url}{path}", json=streamed, timeout=60) as response:
        lines = response.iter_lines()
        seen = [next(lines) for _ in range(12)]
    assert any(line.startswith("data: ") or line.startswith("{") for line in seen)
    wait_until(lambda: served.scheduler.running == 0)
    [gone] = served.board.snapshot()
    assert gone.state == "cancelled" and gone.completion_tokens < 1900
    after = httpx.post(
        f"{served.url}/v1/chat/completions", json={**body, "max_tokens": 5}, timeout=60
    )
    assert after.json()["choices"][0]["finish_reason"] == "length"


def held_stream(
    serve: Serve, tiny_backend: LocalBackend
) -> tuple[PacedBackend, Served, dict[str, Any]]:
    """A server whose answers hand nothing over until the test opens `paced.gate`, and the body
    of a streamed 5-token request to it."""
    paced = PacedBackend(tiny_backend)
    paced.gate.clear()
    body = {
        "model": tiny_backend.card.name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "temperature": 0,
        "stream": True,
    }
    return paced, serve(paced), body


def test_a_stream_starts_before_its_first_token(serve: Serve, tiny_backend: LocalBackend) -> None:
    """Once the model has taken the request, its response and role chunk go out while the
    first token is still being made (here: held back until the client has them)."""
    paced, served, body = held_stream(serve, tiny_backend)
    with httpx.stream(
        "POST", f"{served.url}/v1/chat/completions", json=body, timeout=60
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        first = json.loads(next(lines)[len("data: ") :])
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert served.board.snapshot()[0].completion_tokens == 0  # no token handed over yet
        paced.gate.set()
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events)


def test_a_silent_stream_says_it_is_alive(
    serve: Serve, tiny_backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While nothing comes (a long wait, a long prefill) a stream sends an SSE comment now and
    then, which a client or proxy that gives up on a silent connection sees, and the openai
    client reads past."""
    monkeypatch.setattr(scheduler, "KEEPALIVE_S", 0.1)
    paced, served, body = held_stream(serve, tiny_backend)
    with httpx.stream(
        "POST", f"{served.url}/v1/chat/completions", json=body, timeout=60
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: {")  # the role chunk
        silent = [next(lines) for _ in range(4)]  # (events end in a blank line)
        assert [line for line in silent if line] == [": keep-alive"] * 2
        paced.gate.set()
        rest = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert rest[-1]["choices"][0]["finish_reason"] == "length"

    paced.gate.clear()
    threading.Timer(0.5, paced.gate.set).start()
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
    chunks = list(client.chat.completions.create(**body))  # type: ignore[call-overload]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "".join(
        e["choices"][0]["delta"].get("content", "") for e in rest
    )


def test_a_request_cancelled_from_the_board_leaves_the_queue(
    serve: Serve, demo_backend: LocalBackend
) -> None:
    held = HeldBackend(demo_backend, concurrency=1)  # one slot: the rest queue
    served = serve(held)
    answers: dict[str, httpx.Response] = {}

    def ask(name: str) -> None:
        answers[name] = httpx.post(
            f"{served.url}/v1/chat/completions", json={**HELLO, "max_tokens": 10}, timeout=60
        )

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    assert held.started.acquire(timeout=30)
    second = threading.Thread(target=ask, args=("second",))
    second.start()
    wait_until(lambda: served.scheduler.waiting == 1)
    queued = served.board.snapshot()[1]
    assert served.board.cancel(queued.id)
    second.join(60)
    assert answers["second"].json()["choices"][0]["finish_reason"] == "stop"
    assert served.board.snapshot()[1].state == "cancelled"
    held.go.set()
    first.join(60)
    assert answers["first"].status_code == 200


def test_a_running_answer_cancelled_from_the_board_still_ends_well(
    serve: Serve, tiny_backend: LocalBackend
) -> None:
    served = serve(PacedBackend(tiny_backend, 0.01))  # the cancel comes long before its end
    body = {
        "model": tiny_backend.card.name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1900,
        "temperature": 0,  # sampled, its random weights can pick an end of turn
    }
    answers: list[httpx.Response] = []
    asking = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=120)
        )
    )
    asking.start()
    wait_until(lambda: any(r.state == "answering" for r in served.board.snapshot()))
    assert served.board.cancel(served.board.snapshot()[0].id)
    asking.join(120)
    [answer] = answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["finish_reason"] == "stop"
    assert served.board.snapshot()[0].state == "cancelled"


def test_a_backend_that_answers_two_at_once_gets_two(
    serve: Serve, demo_backend: LocalBackend
) -> None:
    """What LocalBackend will say once it batches: two generate calls run, the third waits."""
    held = HeldBackend(demo_backend, concurrency=2)
    served = serve(held)
    answers: list[httpx.Response] = []

    def ask() -> None:
        body = {**HELLO, "max_tokens": 10}
        answers.append(httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=60))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for thread in threads[:2]:
        thread.start()
    assert held.started.acquire(timeout=30) and held.started.acquire(timeout=30)
    threads[2].start()
    wait_until(lambda: served.scheduler.waiting == 1)
    assert served.scheduler.running == 2
    assert [r.queue_position for r in served.board.snapshot()] == [None, None, 1]
    held.go.set()
    for thread in threads:
        thread.join(60)
    assert [a.status_code for a in answers] == [200, 200, 200]
