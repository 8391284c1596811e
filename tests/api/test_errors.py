"""Bad requests get the API's error shape and a status that says why; the server goes on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from engine.loading import load_model, run_loading
from engine.models.locations import bundled_demo_dir
from exo_tui.chat.backend import LocalBackend
from tests.api.conftest import HeldBackend, Serve

HELLO = {"model": "demo", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
OLLAMA_HELLO = {**HELLO, "stream": False}


def openai_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"]["type"], str)
    return body["error"]["message"]


def ollama_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str)
    return body["error"]


def test_the_key_is_required_on_both_apis(serve: Serve, demo_backend: LocalBackend) -> None:
    url = serve(demo_backend, api_key="s3cret").url
    message = openai_error(httpx.post(f"{url}/v1/chat/completions", json=HELLO), 401)
    assert "Bearer" in message
    wrong = {"Authorization": "Bearer nope"}
    assert "wrong" in openai_error(httpx.get(f"{url}/v1/models", headers=wrong), 401)
    ollama_error(httpx.post(f"{url}/api/chat", json=OLLAMA_HELLO), 401)
    right = {"Authorization": "Bearer s3cret"}
    assert httpx.post(f"{url}/api/chat", json=OLLAMA_HELLO, headers=right).status_code == 200
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0)
    assert api.chat.completions.create(**HELLO).choices  # type: ignore[arg-type]


def test_a_model_not_loaded_is_404_naming_what_is(serve: Serve, demo_backend: LocalBackend) -> None:
    url = serve(demo_backend).url
    wanted = {**HELLO, "model": "llama-70b"}
    message = openai_error(httpx.post(f"{url}/v1/chat/completions", json=wanted), 404)
    assert "llama-70b" in message and "loaded: demo" in message
    assert "loaded: demo" in ollama_error(httpx.post(f"{url}/api/chat", json=wanted), 404)


def test_no_model_loaded_is_503(serve: Serve) -> None:
    url = serve(None).url
    assert "No model is loaded" in openai_error(
        httpx.post(f"{url}/v1/chat/completions", json=HELLO), 503
    )
    ollama_error(httpx.post(f"{url}/api/chat", json=OLLAMA_HELLO), 503)
    assert httpx.get(f"{url}/v1/models").json() == {"object": "list", "data": []}


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"model": "demo"}', "messages"),
        (b'{"model": "demo", "messages": [{"role": "wizard", "content": "hi"}]}', "role"),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "temperature": 5}',
         "temperature"),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}',
         "max_tokens"),
        (b'{"model": "demo", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
         "text only"),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "  "}]}', "empty"),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}],'
         b' "response_format": {"type": "json_object"}}', "response_format json_object is not"),
    ],
)  # fmt: skip
def test_bad_bodies_are_400(
    serve: Serve, demo_backend: LocalBackend, body: bytes, words: str
) -> None:
    url = serve(demo_backend).url
    response = httpx.post(
        f"{url}/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert words in openai_error(response, 400)
    assert httpx.post(f"{url}/v1/chat/completions", json=HELLO).status_code == 200  # goes on


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"messages": []}', "model"),
        (b'{"model": "demo", "messages": [{"content": "hi"}]}', "role"),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}],'
         b' "options": {"temperature": -1}}', "temperature"),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}],'
         b' "options": {"num_predict": 0}}', "num_predict"),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}',
         "stream"),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "format": "json"}',
         "format (JSON output) is not supported"),
    ],
)  # fmt: skip
def test_bad_ollama_bodies_are_400(
    serve: Serve, demo_backend: LocalBackend, body: bytes, words: str
) -> None:
    url = serve(demo_backend).url
    assert words in ollama_error(httpx.post(f"{url}/api/chat", content=body), 400)
    assert httpx.post(f"{url}/api/chat", json=OLLAMA_HELLO).status_code == 200  # goes on


def test_a_prompt_past_the_context_is_400_with_the_numbers(
    serve: Serve, demo_backend: LocalBackend
) -> None:
    url = serve(demo_backend).url
    long = {**HELLO, "messages": [{"role": "user", "content": "hello there " * 3000}]}
    message = openai_error(httpx.post(f"{url}/v1/chat/completions", json=long), 400)
    assert "tokens" in message and "2048" in message
    streamed = httpx.post(f"{url}/v1/chat/completions", json={**long, "stream": True})
    assert "2048" in openai_error(streamed, 400)
    assert "2048" in ollama_error(httpx.post(f"{url}/api/chat", json={**long, "stream": True}), 400)


def test_a_prompt_whose_cache_the_memory_free_could_not_hold_is_400_with_the_sizes(
    serve: Serve,
) -> None:
    free = [0]  # the system's reading of the memory free, set here
    loaded = run_loading(load_model(bundled_demo_dir()), lambda _: None)
    backend = LocalBackend(loaded, free_memory=lambda: free[0])
    try:
        url = serve(backend).url
        for stream in (False, True):
            message = openai_error(
                httpx.post(f"{url}/v1/chat/completions", json={**HELLO, "stream": stream}), 400
            )
            assert "this machine has free" in message and "Shorten the conversation" in message
        assert "this machine has free" in ollama_error(
            httpx.post(f"{url}/api/chat", json=OLLAMA_HELLO), 400
        )
        free[0] = 64 << 30  # memory let go elsewhere: the same request is answered
        assert httpx.post(f"{url}/v1/chat/completions", json=HELLO).status_code == 200
    finally:
        backend.unload()


def test_a_body_over_the_cap_is_413(serve: Serve, demo_backend: LocalBackend) -> None:
    url = serve(demo_backend).url
    huge = {**HELLO, "messages": [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]}
    assert "limit" in openai_error(httpx.post(f"{url}/v1/chat/completions", json=huge), 413)

    def chunks():  # no Content-Length: counted as it comes
        for _ in range(6):
            yield b" " * (1024 * 1024)

    response = httpx.post(f"{url}/api/chat", content=chunks())
    ollama_error(response, 413)


def test_a_full_queue_is_429_with_retry_after(serve: Serve, demo_backend: LocalBackend) -> None:
    held = HeldBackend(demo_backend, concurrency=1)  # one slot: the rest queue
    served = serve(held, max_waiting=1)
    url = served.url
    answers: list[httpx.Response] = []

    def ask() -> None:
        answers.append(httpx.post(f"{url}/v1/chat/completions", json=HELLO, timeout=60))

    first = threading.Thread(target=ask)
    first.start()
    assert held.started.acquire(timeout=30)  # the first holds the slot
    second = threading.Thread(target=ask)
    second.start()
    wait_until(lambda: served.scheduler.waiting == 1)
    full = httpx.post(f"{url}/v1/chat/completions", json=HELLO)
    assert "busy" in openai_error(full, 429) and full.headers["retry-after"].isdigit()
    held.go.set()
    first.join(60)
    second.join(60)
    assert [a.status_code for a in answers] == [200, 200]


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def test_an_unknown_endpoint_or_method_says_where_to_go(
    serve: Serve, demo_backend: LocalBackend
) -> None:
    url = serve(demo_backend).url
    assert "/v1/chat/completions" in openai_error(httpx.get(f"{url}/v1/completions"), 404)
    assert "/api/chat" in ollama_error(httpx.post(f"{url}/api/pull", json={}), 404)
    assert "GET is not allowed" in openai_error(httpx.get(f"{url}/v1/chat/completions"), 405)
    assert httpx.get(url).text == "Ollama is running"  # what Ollama clients probe
