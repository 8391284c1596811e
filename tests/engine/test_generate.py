"""Loading with per-layer progress and generation against plain mlx-lm, on real tiny models."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load as mlx_lm_load
from mlx_lm import stream_generate
from mlx_lm.models.cache import make_prompt_cache

from engine import generate as generate_module
from engine.errors import RequestError
from engine.generate import (
    PREFILL_CHUNK,
    generate,
    last_position_logits,
    next_turn_prefix,
    prefill_next_turn,
    render_prompt,
)
from engine.loading import LoadedModel, load_model, load_model_sync, run_loading
from engine.prompt_cache import TRIM_IN_PLACE_TOKENS
from engine.types import (
    ChatRequest,
    Chunk,
    DoneChunk,
    LoadProgress,
    Message,
    TextChunk,
)
from tests.tiny_models import ARCHITECTURES


def chat(text: str, *history: Message, **kwargs: object) -> ChatRequest:
    return ChatRequest(
        messages=(*history, Message(role="user", content=text)),
        temperature=0.0,
        **kwargs,  # type: ignore[arg-type]
    )


def done_of(chunks: Iterable[Chunk]) -> DoneChunk:
    collected = list(chunks)
    assert isinstance(collected[-1], DoneChunk)
    assert sum(isinstance(c, DoneChunk) for c in collected) == 1
    return collected[-1]


@pytest.fixture(scope="module")
def loaded(tiny_llama: Path) -> LoadedModel:
    model = load_model_sync(tiny_llama)
    # Its speed measured, as after its first answer: a prompt whose prefill takes more than a
    # step is stepped (tests/engine/test_prefill.py), and the first one's speed is not known.
    list(generate(model, chat("hello", max_tokens=1)))
    model.prompt_cache.clear()
    return model


def test_loading_reports_every_layer_and_ends_at_n_of_n(tiny_llama: Path) -> None:
    reports: list[LoadProgress] = []
    result = run_loading(load_model(tiny_llama), reports.append)
    assert isinstance(result, LoadedModel)
    n = result.card.num_layers
    assert [r.layers_loaded for r in reports] == list(range(1, n + 1))
    assert all(r.total == n for r in reports)
    assert reports[-1].layers_loaded == reports[-1].total


def test_layers_are_materialised_one_at_a_time(tiny_llama: Path) -> None:
    """Each report follows one more layer's weights landing in memory, not all at once."""
    loading = load_model(tiny_llama)
    sizes: list[int] = []
    for _ in loading:
        sizes.append(mx.get_active_memory())
    assert len(sizes) > 2
    steps = list(zip(sizes, sizes[1:], strict=False))
    # The next layer is read while one is reported, so the last step may add nothing.
    assert all(later >= earlier for earlier, later in steps)
    assert sum(later > earlier for earlier, later in steps) >= len(steps) - 1


def test_greedy_tokens_match_plain_mlx_lm(tiny_llama: Path, loaded: LoadedModel) -> None:
    request = chat("Tell me about the weather in Paris.", max_tokens=200)
    done = done_of(generate(loaded, request))
    loaded.prompt_cache.clear()

    model, tokenizer = mlx_lm_load(str(tiny_llama))[:2]
    prompt = render_prompt(loaded, request)
    reference = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=200)]
    assert list(done.token_ids) == reference
    assert len(set(reference)) > 10
    assert done.usage.completion_tokens == 200
    assert done.finish_reason == "length"
    assert done.usage.prompt_tokens == len(prompt)


def test_text_chunks_join_to_the_decoded_tokens(loaded: LoadedModel) -> None:
    chunks = list(generate(loaded, chat("Say something.", max_tokens=40)))
    done = done_of(chunks)
    text = "".join(c.text for c in chunks if isinstance(c, TextChunk))
    # mlx-lm's streaming detokenizer drops the space that starts the first token.
    assert text == loaded.tokenizer.decode(list(done.token_ids)).removeprefix(" ")
    assert done.stats.ttft_s > 0
    assert done.stats.decode_tps > 0
    assert done.stats.prefill_tps > 0
    assert done.stats.peak_memory_bytes > 0


def test_next_turn_prefills_only_the_new_tokens(loaded: LoadedModel) -> None:
    loaded.prompt_cache.clear()
    first = chat("What is a pipeline?", max_tokens=12)
    done1 = done_of(generate(loaded, first))
    assert done1.usage.cached_tokens == 0
    answer = loaded.tokenizer.decode(list(done1.token_ids))
    second = chat(
        "And tensor parallel?",
        *first.messages,
        Message(role="assistant", content=answer),
        max_tokens=12,
    )
    done2 = done_of(generate(loaded, second))
    prompt1 = render_prompt(loaded, first)
    prompt2 = render_prompt(loaded, second)
    common = 0
    for a, b in zip(prompt1 + list(done1.token_ids), prompt2, strict=False):
        if a != b:
            break
        common += 1
    # The whole first prompt is reused; random tokens may re-tokenize differently after it.
    assert common >= len(prompt1)
    assert done2.usage.cached_tokens == common
    # Same tokens as a cold start of the same turn.
    loaded.prompt_cache.clear()
    cold = done_of(generate(loaded, second))
    assert cold.usage.cached_tokens == 0
    assert cold.token_ids == done2.token_ids


def test_prefilling_the_next_turn_leaves_only_the_new_message_to_prefill(
    loaded: LoadedModel,
) -> None:
    loaded.prompt_cache.clear()
    first = chat("What is a pipeline?", max_tokens=12)
    done1 = done_of(generate(loaded, first))
    history = (
        *first.messages,
        Message(role="assistant", content=loaded.tokenizer.decode(list(done1.token_ids))),
    )
    # What the app does while the user types the next question.
    prefilled = prefill_next_turn(loaded, first.model_copy(update={"messages": history}))
    prefix = next_turn_prefix(loaded, first.model_copy(update={"messages": history}))
    assert prefilled > 0 and len(prefix) > len(render_prompt(loaded, first))
    assert prefill_next_turn(loaded, first.model_copy(update={"messages": history})) == 0  # done
    second = chat("And tensor parallel?", *history, max_tokens=12)
    prompt2 = render_prompt(loaded, second)
    assert prompt2[: len(prefix)] == prefix
    done2 = done_of(generate(loaded, second))
    assert done2.usage.cached_tokens == len(prefix)
    # Same tokens as a cold start of the same turn.
    loaded.prompt_cache.clear()
    assert done_of(generate(loaded, second)).token_ids == done2.token_ids


def earlier_turn() -> ChatRequest:
    return ChatRequest(
        messages=(
            Message(role="user", content="What is a pipeline?"),
            Message(role="assistant", content="Layers in order, a range per node."),
        ),
        temperature=0.0,
    )


def shared_prefix(first: list[int], second: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), 0)


def test_prefilling_a_typed_draft_leaves_only_what_came_after_it(loaded: LoadedModel) -> None:
    loaded.prompt_cache.clear()
    history = earlier_turn()
    message = "And how does tensor parallel split every layer across the nodes?"
    draft = message[: message.rindex(" ") + 3]  # typed up to two letters of the last word
    prefilled = prefill_next_turn(loaded, history, draft=draft)
    prefix = next_turn_prefix(loaded, history, draft)
    # The whole turn as if the draft were sent: nothing was cached, all of it was prefilled.
    assert prefix == render_prompt(loaded, chat(draft, *history.messages))
    assert prefilled == len(prefix)
    final = chat(message, *history.messages, max_tokens=6)
    prompt = render_prompt(loaded, final)
    done = done_of(generate(loaded, final))
    # What the draft and the message share was cached; the guessed end of the turn was not.
    assert done.usage.cached_tokens == shared_prefix(prefix, prompt)
    settled = draft[: draft.rindex(" ")]  # all but the word being typed
    assert (
        done.usage.cached_tokens >= len(render_prompt(loaded, chat(settled, *history.messages))) - 8
    )
    # Of the new message, only its last word (and the template's end) was left to prefill.
    message_tokens = len(prompt) - len(next_turn_prefix(loaded, history))
    assert done.usage.prompt_tokens - done.usage.cached_tokens < message_tokens / 3
    # Same tokens as a cold start of the same turn.
    loaded.prompt_cache.clear()
    assert done_of(generate(loaded, final)).token_ids == done.token_ids


def test_a_draft_sent_as_it_was_prefilled_leaves_one_token(loaded: LoadedModel) -> None:
    loaded.prompt_cache.clear()
    history = earlier_turn()
    message = "And how does tensor parallel split every layer across the nodes?"
    prefill_next_turn(loaded, history, draft=message)  # the user paused before sending
    final = chat(message, *history.messages, max_tokens=6)
    done = done_of(generate(loaded, final))
    assert done.usage.cached_tokens == done.usage.prompt_tokens - 1
    loaded.prompt_cache.clear()
    assert done_of(generate(loaded, final)).token_ids == done.token_ids


def test_a_draft_edited_before_sending_reuses_what_still_matches(loaded: LoadedModel) -> None:
    loaded.prompt_cache.clear()
    history = earlier_turn()
    prefill_next_turn(loaded, history, draft="Count the apples in the basket ")
    final = chat("Count the pears in the basket please.", *history.messages, max_tokens=6)
    done = done_of(generate(loaded, final))
    shared = shared_prefix(render_prompt(loaded, chat("Count the ", *history.messages)),
                           render_prompt(loaded, final))  # fmt: skip
    assert shared <= done.usage.cached_tokens < len(render_prompt(loaded, final))
    loaded.prompt_cache.clear()
    assert done_of(generate(loaded, final)).token_ids == done.token_ids


def test_a_cancelled_next_turn_prefill_stores_nothing(loaded: LoadedModel) -> None:
    loaded.prompt_cache.clear()
    cancel = threading.Event()
    cancel.set()
    request = chat("hello there", max_tokens=4)
    assert prefill_next_turn(loaded, request, cancel) == 0
    assert len(loaded.prompt_cache) == 0


def test_edited_turn_reuses_the_longest_common_prefix(loaded: LoadedModel) -> None:
    loaded.prompt_cache.clear()
    original = chat("Count the apples in the basket please.", max_tokens=8)
    done_of(generate(loaded, original))
    edited = chat("Count the pears in the basket please.", max_tokens=8)
    done = done_of(generate(loaded, edited))
    a, b = render_prompt(loaded, original), render_prompt(loaded, edited)
    lcp = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert done.usage.cached_tokens == lcp
    # Regenerating the same turn reuses all but the last prompt token.
    again = done_of(generate(loaded, edited))
    assert again.usage.cached_tokens == len(b) - 1
    assert again.token_ids == done.token_ids


class CountingModel:
    """The model, recording how many tokens each forward pass takes."""

    def __init__(self, model: object) -> None:
        self.wrapped = model
        self.lengths: list[int] = []

    def __call__(self, inputs: mx.array, cache: object = None, **kwargs: object) -> mx.array:
        self.lengths.append(inputs.shape[1])
        return self.wrapped(inputs, cache=cache, **kwargs)  # type: ignore[operator]

    def __getattr__(self, name: str) -> object:
        return getattr(self.wrapped, name)


def counted_generate(loaded: LoadedModel, request: ChatRequest) -> tuple[DoneChunk, list[int]]:
    """The answer's DoneChunk and how many tokens each forward pass took."""
    counting = CountingModel(loaded.model)
    done = done_of(generate(dataclasses.replace(loaded, model=counting), request))  # type: ignore[arg-type]
    return done, counting.lengths


# Over 100 tokens: longer than a short rest, within one pass of the tiny llama's 4 layers.
LONG_PROMPT = chat("Tell me about the pipeline and the ring. " * 6)


def typed_then_sent(loaded: LoadedModel, max_tokens: int) -> ChatRequest:
    """A second turn prefilled as the app does while it is typed (all but its last word); then
    its request, which leaves that word and the template's end of the turn to prefill."""
    history = earlier_turn()
    message = "And how does tensor parallel split every layer?"
    prefill_next_turn(loaded, history, draft=message[: message.rindex(" ")])
    return chat(message, *history.messages, max_tokens=max_tokens)


def test_a_short_rest_of_the_prompt_takes_one_pass_with_the_first_token(
    loaded: LoadedModel,
) -> None:
    loaded.prompt_cache.clear()
    counting = CountingModel(loaded.model)
    counted = dataclasses.replace(loaded, model=counting)  # type: ignore[arg-type]
    final = typed_then_sent(counted, max_tokens=6)
    counting.lengths.clear()
    done = done_of(generate(counted, final))
    rest = done.usage.prompt_tokens - done.usage.cached_tokens
    assert rest > 1
    # mlx-lm would prefill rest - 1 tokens, then step the last one: two passes over the weights.
    # Then each of the 6 tokens is fed once (the last one too: the next turn's cache holds it).
    assert counting.lengths == [rest] + [1] * 6
    # Same tokens as a cold start of the same turn.
    loaded.prompt_cache.clear()
    assert done_of(generate(loaded, final)).token_ids == done.token_ids


def test_a_whole_prompt_takes_one_pass_with_the_first_token(loaded: LoadedModel) -> None:
    loaded.prompt_cache.clear()
    done, lengths = counted_generate(loaded, LONG_PROMPT.model_copy(update={"max_tokens": 4}))
    prompt = done.usage.prompt_tokens
    assert done.usage.cached_tokens == 0 and prompt > 100
    assert prompt <= generate_module.ONE_PASS_TOKENS_PER_LAYER * loaded.card.num_layers
    assert lengths == [prompt] + [1] * 4


def test_a_prompt_past_one_pass_puts_all_but_its_last_token_into_the_cache_first(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = LONG_PROMPT.model_copy(update={"max_tokens": 4})
    loaded.prompt_cache.clear()
    whole = done_of(generate(loaded, request))
    monkeypatch.setattr(generate_module, "ONE_PASS_TOKENS_PER_LAYER", 8)  # 32 tokens here
    loaded.prompt_cache.clear()
    split, lengths = counted_generate(loaded, request)
    # The prefill skips the last layer's output, which one pass would compute for every token.
    assert lengths == [split.usage.prompt_tokens - 1, 1] + [1] * 4
    assert split.token_ids == whole.token_ids


def test_a_prompt_longer_than_a_prefill_step_goes_in_steps_to_the_same_tokens(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = LONG_PROMPT.model_copy(update={"max_tokens": 8})
    loaded.prompt_cache.clear()
    whole = done_of(generate(loaded, request))
    monkeypatch.setattr(generate_module, "PREFILL_STEP", 16)
    loaded.prompt_cache.clear()
    stepped, lengths = counted_generate(loaded, request)
    prompt = stepped.usage.prompt_tokens
    # All but the last 16 tokens in steps of 16 (the last of them shorter), then the last 16 in
    # the pass that gives the first token.
    assert sum(lengths[:-8]) == prompt and lengths[-9] == 16
    assert all(n <= 16 for n in lengths[:-8]) and lengths[-8:] == [1] * 8
    assert stepped.token_ids == whole.token_ids


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("tied", [False, True], ids=["own head", "head tied to embeddings"])
def test_the_last_positions_logits_are_the_full_passes_last_row(
    arch: str, tied: bool, tiny_model_factory: Callable[..., Path]
) -> None:
    extra = {"tie_word_embeddings": True} if tied else {}
    loaded = load_model_sync(tiny_model_factory(arch, **extra))
    assert loaded.config.get("tie_word_embeddings", False) == tied

    tokens = mx.array(render_prompt(loaded, chat("Which node holds layer three?")))[None]
    full = loaded.model(tokens, cache=make_prompt_cache(loaded.model))[:, -1, :]
    last = last_position_logits(loaded.model, tokens, make_prompt_cache(loaded.model))
    assert last.shape == full.shape
    assert mx.allclose(last, full, atol=1e-4).item()
    # The head ran on one position: the model's body is its own again afterwards.
    assert "model" not in vars(loaded.model)
    assert loaded.model(tokens, cache=make_prompt_cache(loaded.model)).shape[1] == tokens.shape[1]


def test_stopping_at_the_first_token_of_one_pass_keeps_the_cache_true(
    loaded: LoadedModel,
) -> None:
    loaded.prompt_cache.clear()
    final = typed_then_sent(loaded, max_tokens=1)
    done = done_of(generate(loaded, final))
    assert done.finish_reason == "length" and len(done.token_ids) == 1
    # The first token came out of the single pass before it was fed: the cache holds the prompt.
    prompt = render_prompt(loaded, final)
    cache, rest = loaded.prompt_cache.take(loaded.model, prompt + list(done.token_ids) + [5])
    assert rest == [*done.token_ids, 5]
    assert cache[0].offset == len(prompt)
    loaded.prompt_cache.keep(prompt, cache)  # taken out: put back for the longer answer
    longer = done_of(generate(loaded, final.model_copy(update={"max_tokens": 8})))
    loaded.prompt_cache.clear()
    cold = done_of(generate(loaded, final.model_copy(update={"max_tokens": 8})))
    assert longer.token_ids == cold.token_ids and longer.token_ids[0] == done.token_ids[0]


def test_kept_cache_holds_prompt_and_generated_tokens(loaded: LoadedModel) -> None:
    loaded.prompt_cache.clear()
    request = chat("Hello there.", max_tokens=9)
    done = done_of(generate(loaded, request))
    prompt = render_prompt(loaded, request)
    cache, rest = loaded.prompt_cache.take(loaded.model, prompt + list(done.token_ids) + [5])
    assert rest == [5]
    assert cache[0].offset == len(prompt) + len(done.token_ids)


def test_a_turn_continuing_a_stored_prefix_takes_that_cache_itself(loaded: LoadedModel) -> None:
    # mlx-lm hands out a copy, made lazily in the next forward pass: 20 ms of a 61 ms TTFT at
    # 1,256 tokens of history on the benchmark model.
    store = loaded.prompt_cache
    store.clear()
    prompt = render_prompt(loaded, chat("Hello there."))
    cache, rest = store.take(loaded.model, prompt)
    loaded.model(mx.array(rest)[None], cache=cache)
    store.keep(prompt, cache)
    assert store.reusable([*prompt, 7, 8]) == len(prompt) and len(store) == 1  # looking keeps it
    taken, rest = store.take(loaded.model, [*prompt, 7, 8])
    assert taken is cache and rest == [7, 8]
    assert len(store) == 0 and store.nbytes == 0


def test_another_branch_is_copied_and_stays(loaded: LoadedModel) -> None:
    store = loaded.prompt_cache
    store.clear()
    first = render_prompt(loaded, chat("Hello there. " * 30))
    cache, rest = store.take(loaded.model, first)
    loaded.model(mx.array(rest)[None], cache=cache)
    store.keep(first, cache)
    other = render_prompt(loaded, chat("Good morning."))  # another chat
    held = store.reusable(other)
    assert len(first) - held > TRIM_IN_PLACE_TOKENS
    taken, rest = store.take(loaded.model, other)
    assert taken is not cache and taken[0].offset == held and rest == other[held:]
    assert store.reusable(first) == len(first) - 1 and cache[0].offset == len(first)


def test_a_longer_entry_is_trimmed_in_place(loaded: LoadedModel) -> None:
    store = loaded.prompt_cache
    store.clear()
    answered = render_prompt(loaded, chat("Hello there.")) + [7, 8, 9]
    cache, rest = store.take(loaded.model, answered)
    loaded.model(mx.array(rest)[None], cache=cache)
    store.keep(answered, cache)
    regenerated = [*answered[:-2], 5]  # the same question, another answer
    assert store.reusable(regenerated) == len(answered) - 2
    taken, rest = store.take(loaded.model, regenerated)
    assert taken is cache and rest == [5] and cache[0].offset == len(answered) - 2
    assert len(store) == 0


def test_a_cancelled_prefill_keeps_the_steps_it_made(loaded: LoadedModel) -> None:
    loaded.prompt_cache.clear()
    history = earlier_turn()
    draft = "Tell me how every node in the cluster holds its share of the layers " * 4

    class AfterOneStep:
        steps = 0

        def is_set(self) -> bool:
            self.steps += 1
            return self.steps > 1

    assert prefill_next_turn(loaded, history, AfterOneStep(), draft) == PREFILL_CHUNK
    prefix = next_turn_prefix(loaded, history, draft)
    assert len(prefix) > PREFILL_CHUNK + 1
    assert loaded.prompt_cache.reusable(prefix) == PREFILL_CHUNK
    assert prefill_next_turn(loaded, history, draft=draft) == len(prefix) - PREFILL_CHUNK


def test_an_answer_left_unread_puts_its_cache_back(loaded: LoadedModel) -> None:
    loaded.prompt_cache.clear()
    request = chat("Hello there.", max_tokens=20)
    prompt = render_prompt(loaded, request)
    chunks = generate(loaded, request)
    next(chunks)
    chunks.close()  # the caller stops listening mid-answer
    assert loaded.prompt_cache.reusable([*prompt, 5]) >= len(prompt)


def test_cache_memory_is_bounded_and_released(tiny_llama: Path) -> None:
    model = load_model_sync(tiny_llama)
    model.prompt_cache.max_entries = 2
    model.prompt_cache.clear()
    for word in ("red", "green", "blue", "yellow"):  # four chats: each its own branch
        message = f"{word}: " + "paint the fence in this colour and say why " * 10
        done_of(generate(model, chat(message, max_tokens=4)))
    assert len(model.prompt_cache) == 2
    assert model.prompt_cache.nbytes > 0
    model.unload()
    assert len(model.prompt_cache) == 0
    assert model.prompt_cache.nbytes == 0


def test_cancel_ends_with_a_cancelled_done(loaded: LoadedModel) -> None:
    cancel = threading.Event()
    count = 0
    chunks: list[Chunk] = []
    for chunk in generate(loaded, chat("Go on forever.", max_tokens=500), cancel):
        chunks.append(chunk)
        if isinstance(chunk, TextChunk):
            count += 1
            if count == 5:
                cancel.set()
    done = done_of(chunks)
    assert done.finish_reason == "cancelled"
    assert 5 <= done.usage.completion_tokens <= 6


def test_seeded_sampling_repeats(loaded: LoadedModel) -> None:
    request = ChatRequest(
        messages=(Message(role="user", content="Pick words."),),
        temperature=0.9,
        seed=42,
        max_tokens=30,
    )
    first = done_of(generate(loaded, request)).token_ids
    second = done_of(generate(loaded, request)).token_ids
    other = done_of(generate(loaded, request.model_copy(update={"seed": 7}))).token_ids
    assert first == second
    assert first != other


def test_empty_prompt_is_refused(loaded: LoadedModel) -> None:
    with pytest.raises(RequestError, match="prompt is empty"):
        list(generate(loaded, chat("   ")))


def test_prompt_longer_than_the_context_is_refused(tiny_model_factory) -> None:  # type: ignore[no-untyped-def]
    path = tiny_model_factory("llama", max_position_embeddings=64)
    small = load_model_sync(path)
    with pytest.raises(RequestError, match=r"tokens but .* holds at most 64"):
        list(generate(small, chat("word " * 200)))


def test_every_architecture_loads_and_generates(tiny_model: Path) -> None:
    model = load_model_sync(tiny_model)
    done = done_of(generate(model, chat("Hello!", max_tokens=20)))
    assert done.usage.completion_tokens == 20
    assert len(set(done.token_ids)) > 3


def test_the_store_serves_a_reader_while_another_thread_takes_and_keeps(
    loaded: LoadedModel,
) -> None:
    # The app's thread looks at the store (and clears it) while a prefill worker takes and keeps
    # entries: a look in the middle of a take found a branch whose entry had just left.
    store = loaded.prompt_cache
    store.clear()
    base = render_prompt(loaded, chat("Hello there."))
    cache, rest = store.take(loaded.model, base)
    loaded.model(mx.array(rest)[None], cache=cache)
    store.keep(base, cache)
    stop = threading.Event()
    errors: list[BaseException] = []

    def take_and_keep() -> None:
        try:
            turn = 0
            while not stop.is_set():
                branch = [*base, *range(turn % 5 + 1)]  # branches come and go under `base`
                taken, _ = store.take(loaded.model, branch)
                store.keep(branch[: taken[0].offset], taken)
                turn += 1
        except BaseException as error:
            errors.append(error)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads trade the GIL often: every race gets its turn
    worker = threading.Thread(target=take_and_keep)
    worker.start()
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and not errors:
            assert store.reusable([*base, 9, 9]) <= len(base)
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(switch)
    assert not errors
