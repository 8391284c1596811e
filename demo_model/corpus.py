"""The demo model's synthetic chat corpus: fixed seed, many phrasings, a held-out set.

Intents: small talk and questions the model cannot answer (a polite refusal); questions about
exo-tui, answered from the README's facts; arithmetic, answered by calling `calculator` with the
expression; the date and time, by calling `clock`; the cluster (nodes, memory, loaded model), by
calling `cluster_status`. After a tool result comes a one-sentence answer built from it.

Every intent has training phrasings and held-out phrasings (`split="heldout"`): the held-out ones
never appear in training and `bench/demo_eval.py` measures the model on them.

    python -m demo_model.corpus            # print a few rendered-free samples
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Split = Literal["train", "heldout"]
Intent = Literal["calculator", "clock", "cluster_status", "chat"]

SEED = 0

# --------------------------------------------------------------------------- phrasing helpers

_PREFIXES = [
    *[""] * 12,
    "hey, ", "hi, ", "ok, ", "so ", "hmm, ", "quick question: ", "excuse me, ", "exo, ",
    "hello! ", "one thing: ", "well, ", "yo, ",
]  # fmt: skip
_SUFFIXES = [*[""] * 6, "?", "?", "!", " please", " thanks", " pls", "??", " :)", ", thank you"]


def _dress(rng: random.Random, text: str) -> str:
    """Add a prefix, a suffix and a casing to a core phrasing."""
    text = rng.choice(_PREFIXES) + text + rng.choice(_SUFFIXES)
    roll = rng.random()
    if roll < 0.45:
        text = text[:1].upper() + text[1:]
    elif roll < 0.5:
        text = text.upper() if len(text) < 40 else text
    return text


def _pick(rng: random.Random, split: Split, train: list[str], heldout: list[str]) -> str:
    return rng.choice(train if split == "train" else heldout)


# --------------------------------------------------------------------------- tool calls


def _tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_turns(
    question: str, name: str, arguments: dict[str, Any], result: str, answer: str
) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [_tool_call(name, arguments)]},
        {"role": "tool", "content": result, "tool_call_id": "call_0", "name": name},
        {"role": "assistant", "content": answer},
    ]


# --------------------------------------------------------------------------- arithmetic


def _int(rng: random.Random, high: int = 9999) -> int:
    digits = min(rng.choice([1, 1, 2, 2, 2, 3, 3, 4]), len(str(high)))
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), min(high, 10**digits - 1))


def _number(rng: random.Random) -> str:
    if rng.random() < 0.08:
        return f"{rng.randint(0, 99)}.{rng.randint(1, 99)}".rstrip("0")
    return str(_int(rng))


def _result_text(expression: str) -> str:
    from exo_tui.chat.tools import ToolError, calculate

    try:
        return str(calculate(expression))
    except ToolError as error:
        return f"error: {error}"


@dataclass(frozen=True)
class Arithmetic:
    user_form: str  # how the user wrote the operation
    expression: str  # what goes to the calculator
    spoken: str  # how the answer names it


# Per operator: (training forms, held-out-only forms); {a} {b} are numbers. Held-out questions use
# both lists, so new question frames meet known and new operator words.
_OPERATORS: dict[str, tuple[list[str], list[str]]] = {
    "+": (
        [
            "{a} plus {b}",
            "{a} + {b}",
            "{a}+{b}",
            "the sum of {a} and {b}",
            "add {a} and {b}",
            "add {b} to {a}",
            "{a} and {b} added together",
            "{a} added to {b}",
        ],
        ["sum of {a} and {b}", "{a} added with {b}"],
    ),
    "-": (
        [
            "{a} minus {b}",
            "{a} - {b}",
            "{a}-{b}",
            "subtract {b} from {a}",
            "{a} take away {b}",
            "the difference between {a} and {b}",
            "{a} less {b}",
        ],
        ["{a} subtract {b}", "{a} with {b} taken away"],
    ),
    "*": (
        [
            "{a} times {b}",
            "{a} * {b}",
            "{a}*{b}",
            "{a} x {b}",
            "{a} multiplied by {b}",
            "multiply {a} by {b}",
            "the product of {a} and {b}",
            "{a} × {b}",
        ],
        ["{a} multiplied with {b}", "product of {a} and {b}"],
    ),
    "/": (
        [
            "{a} divided by {b}",
            "{a} / {b}",
            "{a}/{b}",
            "divide {a} by {b}",
            "{a} over {b}",
            "{a} ÷ {b}",
            "the quotient of {a} and {b}",
        ],
        ["{a} split by {b}", "{a} divided into {b}"],
    ),
    "**": (
        [
            "{a} to the power of {b}",
            "{a}^{b}",
            "{a} ** {b}",
            "{a} raised to {b}",
            "{a} to the {b}th power",
        ],
        ["{a} to the power {b}", "{a} ^ {b}"],
    ),
}
_SPOKEN = {"+": "plus", "-": "minus", "*": "times", "/": "divided by", "**": "to the power of"}


def _operands(rng: random.Random, op: str) -> tuple[str, str]:
    if op == "/":
        if rng.random() < 0.02:
            return _number(rng), "0"
        if rng.random() < 0.75:  # mostly exact divisions
            b = _int(rng, 99) or 1
            return str(b * _int(rng, 999)), str(b)
        return _number(rng), str(_int(rng, 99) or 1)
    if op == "**":
        return str(rng.randint(2, 20)), str(rng.randint(2, 6))
    return _number(rng), _number(rng)


def arithmetic(rng: random.Random, split: Split) -> Arithmetic:
    kind = rng.random()
    if kind < 0.06:  # squares and square roots
        a = str(_int(rng, 999))
        if rng.random() < 0.5:
            form = _pick(rng, split, ["{a} squared", "the square of {a}", "{a} to the square"],
                         ["square {a}"])  # fmt: skip
            return Arithmetic(form.format(a=a), f"{a} ** 2", f"{a} squared")
        form = _pick(rng, split, ["the square root of {a}", "sqrt of {a}", "sqrt({a})",
                                  "square root of {a}"], ["the root of {a}"])  # fmt: skip
        return Arithmetic(form.format(a=a), f"sqrt({a})", f"the square root of {a}")
    if kind < 0.11:  # percentages
        p, a = (
            str(rng.choice([5, 10, 15, 20, 25, 30, 40, 50, 75, rng.randint(1, 99)])),
            _number(rng),
        )
        form = _pick(rng, split, ["{p}% of {a}", "{p} percent of {a}", "{p} per cent of {a}"],
                     ["{p} pct of {a}"])  # fmt: skip
        return Arithmetic(form.format(p=p, a=a), f"{p} / 100 * {a}", f"{p}% of {a}")
    if kind < 0.18:  # a written expression with parentheses, copied as it is
        a, b, c = _number(rng), _number(rng), str(_int(rng, 99))
        op1, op2 = rng.choice(["+", "-"]), rng.choice(["*", "/"])
        expression = rng.choice([f"({a} {op1} {b}) {op2} {c}", f"{c} {op2} ({a} {op1} {b})"])
        return Arithmetic(expression, expression, expression)
    op = rng.choices(list(_OPERATORS), weights=[3, 3, 3, 3, 1])[0]
    a, b = _operands(rng, op)
    train, heldout = _OPERATORS[op]
    form = _pick(rng, split, train, train + heldout)
    return Arithmetic(form.format(a=a, b=b), f"{a} {op} {b}", f"{a} {_SPOKEN[op]} {b}")


_CALC_FRAMES = (
    ["what is {e}", "what's {e}", "whats {e}", "compute {e}", "calculate {e}", "how much is {e}",
     "{e}", "{e} = ?", "{e} =", "can you work out {e}", "please calculate {e}", "I need {e}",
     "quick maths: {e}", "solve {e}", "what do you get for {e}", "tell me {e}", "evaluate {e}",
     "what does {e} come to", "figure out {e} for me", "do you know what {e} is",
     "help me with {e}",
     "what is the result of {e}", "can you calculate {e}", "how much does {e} make",
     "work out {e}", "could you compute {e}", "what's the answer to {e}", "{e} is how much"],
    ["what would {e} be", "could you tell me what {e} equals", "give me {e}",
     "I wonder what {e} is", "{e} equals what", "do the math: {e}", "what is {e} exactly",
     "can you help me compute {e}"],
)  # fmt: skip


# Frames built from parts, so the model learns "numbers and an operator mean calculator" rather
# than a list of sentences; none of them may equal a held-out frame (checked below).
_CALC_LEADS = [
    "",
    "",
    "",
    "can you ",
    "could you ",
    "please ",
    "would you ",
    "pls ",
    "now ",
    "I'd like you to ",
    "I want you to ",
    "go ahead and ",
    "try to ",
]
_CALC_VERBS = [
    "calculate {e}",
    "compute {e}",
    "work out {e}",
    "figure out {e}",
    "evaluate {e}",
    "solve {e}",
    "find {e}",
    "check {e}",
    "tell me {e}",
    "answer {e}",
    "find out {e}",
    "determine {e}",
    "crunch {e}",
]
_CALC_QUESTIONS = [
    "what is {e}",
    "what's {e}",
    "whats {e}",
    "how much is {e}",
    "what does {e} equal",
    "what does {e} give",
    "what do I get from {e}",
    "what comes out of {e}",
    "what's the value of {e}",
    "what is the answer for {e}",
    "what's the result of {e}",
    "{e} is what",
    "{e} makes how much",
    "the answer to {e}",
    "how much do I get for {e}",
    "what's {e} equal to",
    "what is {e} equal to",
    "result of {e}",
    "value of {e}",
    "{e}",
    "{e} = ?",
    "{e}=?",
    "{e} = what",
    # modal and reordered questions: the words around the numbers vary, the calculation stays
    "what will {e} be",
    "what {e} comes to",
    "what {e} is",
    "how much would {e} be",
    "what would {e} give",
    "what would {e} come to",
    "what would {e} make",
    "what should {e} be",
    "what could {e} be",
    "what might {e} be",
    "how much will {e} be",
    "{e} would be what",
    "{e} comes to what",
    "{e} gives what",
    "{e} makes what",
    "{e} equals how much",
    "{e} would be how much",
    "the result of {e}",
    "the value of {e}",
    "how big is {e}",
]
_CALC_ASKS = [
    "",
    "",
    "do you know ",
    "can you tell me ",
    "tell me ",
    "any idea ",
    "so ",
    "quick one: ",
    "math question: ",
    "question: ",
]
_CALC_TAILS = [
    "",
    "",
    "",
    " for me",
    " real quick",
    " now",
    " right now",
    " if you can",
    " in your head",
    " please",
    " quickly",
]


# Generic filler around any question (tool or not): openers, closers and stray words, so that
# words never seen around a calculation do not hide the numbers and the operator.
_FILLER_OPENERS = [
    "tell me, ", "say, ", "listen, ", "btw, ", "by the way, ", "real quick, ", "one more: ",
    "next: ", "and ", "also, ", "then ", "ok so ", "alright, ", "right, ", "I'm curious, ",
    "I was wondering, ", "just curious: ", "help: ", "math: ", "maths: ", "homework: ",
    "for my homework, ", "for a recipe, ", "for work, ", "let's see, ", "hey assistant, ",
    "computer, ", "assistant: ", "please help, ", "question for you: ", "here's one: ",
    "try this: ", "another one: ", "last one: ", "I need to know: ", "serious question: ",
    "sorry, ", "um, ", "uh, ", "so, ", "now then, ", "oh, ", "wait, ", "hey there, ",
]  # fmt: skip
_FILLER_CLOSERS = [
    " exactly", " precisely", " approximately", " roughly", " again", " then", " at all",
    " by the way", " in total", " altogether", " overall", " today", " for my homework",
    " if possible", " if you would", " thanks in advance", " asap", " please and thank you",
    " I think", " I guess", " or so", " for real", " honestly", " actually", " really quick",
    " by any chance", " to be exact", " to be precise", " when you can", " once more",
    " I'm curious", " I wonder", " just asking", " no rush", " please help", " if you know",
    " do you know", " can you", " for a friend", " right", " ok", " correct", " though",
]  # fmt: skip
_STRAY_WORDS = [
    "just", "really", "actually", "exactly", "now", "then", "so", "well", "like", "basically",
    "honestly", "maybe", "perhaps", "simply", "quickly", "again", "precisely", "kind of",
    "roughly", "about", "still", "also", "too", "anyway", "please", "ok", "umm", "hmm",
]  # fmt: skip


def _fill(rng: random.Random, frame: str, rate: float) -> str:
    """With probability `rate`, wrap a frame in filler: an opener, a closer or a stray word."""
    if rng.random() >= rate:
        return frame
    roll = rng.random()
    if roll < 0.35:
        return rng.choice(_FILLER_OPENERS) + frame
    if roll < 0.7:
        return frame + rng.choice(_FILLER_CLOSERS)
    if roll < 0.85:
        return rng.choice(_FILLER_OPENERS) + frame + rng.choice(_FILLER_CLOSERS)
    words = frame.split(" ")
    at = rng.randint(0, len(words))
    return " ".join([*words[:at], rng.choice(_STRAY_WORDS), *words[at:]])


def _calc_frame(rng: random.Random, split: Split) -> str:
    if split == "heldout":
        return rng.choice(_CALC_FRAMES[1])
    while True:
        roll = rng.random()
        if roll < 0.25:
            frame = rng.choice(_CALC_FRAMES[0])
        elif roll < 0.5:
            frame = rng.choice(_CALC_LEADS) + rng.choice(_CALC_VERBS) + rng.choice(_CALC_TAILS)
        else:
            frame = rng.choice(_CALC_ASKS) + rng.choice(_CALC_QUESTIONS) + rng.choice(_CALC_TAILS)
        frame = _fill(rng, frame, 0.4)
        if frame not in _CALC_FRAMES[1]:
            return frame


def calculator_turns(rng: random.Random, split: Split) -> tuple[list[dict[str, Any]], Arithmetic]:
    calc = arithmetic(rng, split)
    frame = _calc_frame(rng, split)
    question = _dress(rng, frame.format(e=calc.user_form))
    result = _result_text(calc.expression)
    answer = calculator_answer(calc.spoken, result)
    return _tool_turns(
        question, "calculator", {"expression": calc.expression}, result, answer
    ), calc


def calculator_answer(spoken: str, result: str) -> str:
    if result.startswith("error: "):
        return f"I could not work that out: {result.removeprefix('error: ')}."
    return f"{spoken[:1].upper()}{spoken[1:]} is {result}."


# --------------------------------------------------------------------------- clock

_CLOCK_FRAMES = (
    ["what time is it", "what's the time", "tell me the time", "what day is it today",
     "what's today's date", "what is the date", "do you have the time", "current time",
     "time?", "what day of the week is it", "what's the date today", "what time is it now",
     "can you tell me the time", "which day is today", "what is today", "the time please",
     "what's the time right now", "how late is it", "date and time", "what's the day today",
     "tell me today's date", "is it late already", "what hour is it", "check the time"],
    ["what's the current time", "could you check the clock", "which date is it",
     "what time do we have", "got the time", "what is the time now", "today's date please"],
)  # fmt: skip
_WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
]  # fmt: skip
_ZONES = ["UTC", "UTC", "CET", "CEST", "EST", "PST", "JST", "BST", "IST", ""]


def clock_text(rng: random.Random) -> str:
    """What `clock` returns (`exo_tui.chat.tools.now_text`), for a random moment."""
    text = (
        f"{rng.choice(_WEEKDAYS)} {rng.randint(1, 28):02d} {rng.choice(_MONTHS)} "
        f"{rng.randint(2024, 2032)}, {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} "
        f"{rng.choice(_ZONES)}"
    )
    return text.strip()


def clock_answer(result: str) -> str:
    date, _, rest = result.partition(", ")
    hhmm = rest.split(" ")[0]
    return f"It is {hhmm} on {date}."


# Clock questions built from parts too (none may equal a held-out frame: checked below).
_CLOCK_LEADS = [
    "tell me ", "can you tell me ", "do you know ", "I'd like to know ", "I want to know ",
    "please tell me ", "let me know ", "any idea ", "I need to know ", "could you say ",
    "show me ", "remind me ", "would you tell me ", "I'm asking for ",
]  # fmt: skip
_CLOCK_CORES = [
    "the time", "the exact time", "the date", "the current date", "the date today",
    "what time it is", "what day it is", "what the date is", "what the time is", "the hour",
    "what the clock says", "the day", "the weekday", "the time and date", "which day it is",
    "how late it is", "the local time", "the time of day",
]  # fmt: skip
_CLOCK_TAILS = [
    "", "", "", " please", " now", " right now", " today", " here", " where you are",
    " at the moment", " for me", " quickly", " currently",
]  # fmt: skip
_CLOCK_EXTRA = [
    "what time have we got", "what o'clock is it", "what's the hour", "what does the clock say",
    "look at the clock", "the clock please", "what time is it there",
    "is it morning or evening", "time check",
    "what's the date and time", "what day and time is it",
]  # fmt: skip


def _clock_frame(rng: random.Random, split: Split) -> str:
    if split == "heldout":
        return rng.choice(_CLOCK_FRAMES[1])
    while True:
        roll = rng.random()
        if roll < 0.45:
            frame = rng.choice(_CLOCK_FRAMES[0])
        elif roll < 0.6:
            frame = rng.choice(_CLOCK_EXTRA)
        else:
            frame = rng.choice(_CLOCK_LEADS) + rng.choice(_CLOCK_CORES) + rng.choice(_CLOCK_TAILS)
        frame = _fill(rng, frame, 0.2)
        if frame not in _CLOCK_FRAMES[1]:
            return frame


def clock_turns(rng: random.Random, split: Split) -> list[dict[str, Any]]:
    question = _dress(rng, _clock_frame(rng, split))
    result = clock_text(rng)
    return _tool_turns(question, "clock", {}, result, clock_answer(result))


# --------------------------------------------------------------------------- cluster

ClusterAspect = Literal["memory", "nodes", "model", "general"]
_CLUSTER_FRAMES: dict[str, tuple[list[str], list[str]]] = {
    "memory": (
        ["how much memory does my cluster have", "how much RAM is free", "how much memory is "
         "available", "what's the total memory", "how much memory do I have", "memory status",
         "how much RAM do my machines have", "how much memory is left", "is there free memory",
         "how much memory is in use", "show me the memory", "how much RAM does the cluster have",
         "how many GB of memory do I have", "how much free RAM is there"],
        ["what is the memory of my cluster", "how much memory can I use", "RAM left?",
         "how much memory is there in total"],
    ),
    "nodes": (
        ["how many nodes are in my cluster", "which machines are connected", "list the nodes",
         "what nodes do I have", "who is in the cluster", "how many machines do I have",
         "show me the nodes", "which nodes are online", "what machines are in the cluster",
         "how many computers are connected", "name the nodes", "are my nodes connected"],
        ["which nodes are there", "how many nodes do I have", "what machines do I have"],
    ),
    "model": (
        ["which model is loaded", "what model is running", "is a model loaded",
         "what model are we using", "which model is running on the cluster", "what is loaded",
         "which model am I talking to", "is anything loaded", "what model is in memory"],
        ["what model is loaded right now", "which model is active", "what's loaded"],
    ),
    "general": (
        ["cluster status", "how is my cluster doing", "show me the cluster", "what's the state "
         "of my cluster", "status?", "give me a cluster overview", "tell me about my cluster",
         "check the cluster", "what does my cluster look like", "report on the cluster",
         "describe my setup", "how are my machines"],
        ["what is the cluster status", "summarize my cluster", "cluster overview please"],
    ),
}  # fmt: skip
_HOSTS = [
    "vm", "mac-studio", "macbook", "mac-mini", "studio", "laptop", "desktop", "gpu-box", "rpi4",
    "server", "nas", "workstation", "m2-air", "m4-pro", "tower", "box", "lab", "homelab", "pi",
    "node", "alpha", "beta", "gamma", "delta", "omega", "kitchen-pc", "office", "attic", "dev",
]  # fmt: skip
_OWNERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "ivan", "judy", "mia", "li"]
_DEVICES = ["macbook-pro", "macbook-air", "mac-mini", "imac", "pc", "laptop", "desktop", "rig"]
_STEMS = ["node", "srv", "gpu", "rack", "worker", "host", "ip", "box", "vm", "cpu", "db", "web"]
_SYLLABLES = [
    "ka", "ro", "mi", "ten", "zu", "vel", "dor", "ix", "an", "bo", "qu", "lin", "sa", "te", "nor",
    "pe", "gri", "mo", "fa", "hu", "ya", "el", "os", "ri", "va", "lu", "ne", "ta", "xo", "wen",
    "dal", "kir", "po", "ze", "sha", "tor", "bi", "gu", "jo", "cy", "ph", "tr", "st", "ar", "um",
]  # fmt: skip
_MODEL_FAMILIES = [
    "Qwen3", "Qwen2.5", "Llama-3.2", "Llama-3.1", "Mistral", "phi-4", "gemma-3", "SmolLM2",
    "DeepSeek-R1", "granite-3.3", "OLMo-2", "Ministral", "gpt-oss",
]  # fmt: skip
_MODELS = [
    "Qwen3-0.6B-4bit", "Qwen3-4B-4bit", "Llama-3.2-1B-Instruct-4bit",
    "Llama-3.2-3B-Instruct", "gpt-oss-20b-MXFP4-Q8", "Mistral-7B-Instruct-v0.3-4bit",
    "Qwen2.5-7B-Instruct-4bit", "phi-4-mini-instruct", "gemma-3-1b-it",
]  # fmt: skip
_MEMORY = [4, 8, 8, 16, 16, 16, 24, 24, 32, 32, 36, 48, 64, 64, 96, 128, 192]


def _made_up(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))


# Node names `bench/demo_eval.py` gives its node: training never produces them, nor any name
# containing one of them or their words (so the eval measures copying, not recall).
HELDOUT_NODE_NAMES = ("zephyr-42", "quokka", "tundra-box", "orion-7", "kestrel")
_HELDOUT_NAME_PARTS = sorted(
    {name for name in HELDOUT_NODE_NAMES}
    | {part for name in HELDOUT_NODE_NAMES for part in name.split("-") if len(part) >= 4}
)


def is_heldout_name(name: str) -> bool:
    """Whether a name contains a held-out node name or one of its words (any case)."""
    lower = name.lower()
    return any(part in lower for part in _HELDOUT_NAME_PARTS)


_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_CONSONANTS = "bcdfghjklmnprstvwxz"
_VOWELS = "aeiouy"
_CLUSTERS = ["br", "tr", "st", "sk", "pl", "gr", "ch", "sh", "th", "kr", "dr", "fl", "sn", "zh"]


def _letters(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(_LETTERS) for _ in range(length))


def _pronounceable(rng: random.Random, length: int) -> str:
    """Consonant-vowel syllables (now and then a cluster or a closing consonant), `length` long."""
    out = ""
    consonant = rng.random() < 0.7
    while len(out) < length:
        if consonant:
            out += rng.choice(_CLUSTERS) if rng.random() < 0.12 else rng.choice(_CONSONANTS)
        else:
            out += rng.choice(_VOWELS)
        consonant = not consonant if rng.random() < 0.9 else consonant
    return out[:length]


def _random_word(rng: random.Random, length: int) -> str:
    return _pronounceable(rng, length) if rng.random() < 0.55 else _letters(rng, length)


def random_name(rng: random.Random) -> str:
    """A name of random characters, 3-12 long: letter strings, consonant-vowel strings, with
    digits and dashes, now and then uppercase. The tokenizer splits such names into many
    different token sequences, so an answer can only name them by copying from the result."""
    length = rng.randint(3, 12)
    roll = rng.random()
    if roll < 0.3:  # one word
        name = _random_word(rng, length)
    elif roll < 0.5:  # word-digits or word+digits
        digits = rng.randint(1, min(4, length - 2))
        word = _random_word(rng, max(2, length - digits - 1))
        sep = rng.choice(["-", "-", ""])
        number = "".join(rng.choice("0123456789") for _ in range(digits))
        name = f"{word}{sep}{number}"
    elif roll < 0.7:  # word-word
        first = rng.randint(2, max(2, length - 3))
        second = max(1, length - first - 1)
        name = f"{_random_word(rng, first)}-{_random_word(rng, second)}"
    elif roll < 0.85:  # letters and digits mixed
        name = "".join(rng.choice(_LETTERS + "0123456789") for _ in range(length))
        name = rng.choice(_LETTERS) + name[1:]
    else:  # several short parts with dashes
        parts = []
        while sum(len(x) + 1 for x in parts) < length:
            parts.append(
                _random_word(rng, rng.randint(1, 4))
                if rng.random() < 0.6
                else str(rng.randint(0, 99))
            )
        name = "-".join(parts)[:length].strip("-") or _letters(rng, 3)
    casing = rng.random()
    if casing < 0.08:
        name = name[:1].upper() + name[1:]
    elif casing < 0.11:
        name = name.upper()
    elif casing < 0.13:
        name = "".join(c.upper() if rng.random() < 0.3 else c for c in name)
    return name


def _classic_host(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.15:
        name = rng.choice(_HOSTS)
    elif roll < 0.27:
        name = f"{rng.choice(_OWNERS)}-{rng.choice(_HOSTS)}"
    elif roll < 0.4:
        name = f"{rng.choice(_HOSTS + _STEMS)}-{rng.randint(0, 99)}"
    elif roll < 0.6:
        name = _made_up(rng)
    elif roll < 0.7:
        name = f"{_made_up(rng)}{rng.choice(['', '-'])}{rng.randint(0, 999)}"
    elif roll < 0.78:
        name = f"{_made_up(rng)}-{_made_up(rng)}"
    elif roll < 0.86:
        name = "".join(rng.choice("0123456789abcdef") for _ in range(rng.choice([6, 8, 12])))
    elif roll < 0.93:
        name = f"{rng.choice(_OWNERS + [_made_up(rng)])}s-{rng.choice(_DEVICES)}"
    else:
        name = f"{rng.choice(_STEMS)}-{rng.randint(0, 255)}-{rng.randint(0, 255)}"
    if rng.random() < 0.08:
        name = name[:1].upper() + name[1:]
    return name


RANDOM_NAME_SHARE = 0.55


def _host(rng: random.Random, random_names: bool = False) -> str:
    """A node name: known words, made-up words, digits, dashes, hex ids and (`random_names`,
    training) often random characters; the answer copies it. Never a held-out node name."""
    while True:
        if random_names and rng.random() < RANDOM_NAME_SHARE:
            name = random_name(rng)
        else:
            name = _classic_host(rng)
        if not is_heldout_name(name):
            return name


def _model_name(rng: random.Random, random_names: bool = False) -> str | None:
    roll = rng.random()
    if roll < 0.2:
        return None
    if random_names and rng.random() < 0.2:  # a model name of random characters
        while True:
            size = rng.choice(["0.5B", "1B", "3B", "7B", "8B", "14B", f"{rng.randint(1, 99)}B"])
            name = random_name(rng)
            name = rng.choice(
                [name, f"{name}-{size}", f"{name}-{size}-{rng.choice(['4bit', 'it'])}"]
            )
            if not is_heldout_name(name):
                return name
    if roll < 0.4:
        return "demo"
    if roll < 0.65:
        return rng.choice(_MODELS)
    if roll < 0.9:
        size = rng.choice(["0.5B", "1B", "1.5B", "3B", "4B", "7B", "8B", "14B", "32B", "70B"])
        parts = [rng.choice(_MODEL_FAMILIES), size]
        parts += rng.sample(["Instruct", "it", "4bit", "8bit", "bf16", "chat"], rng.randint(0, 2))
        return "-".join(parts)
    return f"{_made_up(rng)}-{rng.randint(1, 9)}"


def cluster_status(rng: random.Random, random_names: bool = False) -> dict[str, Any]:
    """A random status in the shape of `exo_tui.chat.tools.local_cluster_status`, 1-5 nodes
    (`random_names`: many names of random characters, as training uses)."""
    count = rng.choices([1, 2, 3, 4, 5], weights=[5, 3, 2, 1, 1])[0]
    names: list[str] = []
    while len(names) < count:
        name = _host(rng, random_names)
        if name not in names:
            names.append(name)
    nodes: list[dict[str, Any]] = []
    for name in names:
        total = round(max(1.0, rng.choice(_MEMORY) - rng.random() * 1.5), 1)
        available = round(total * rng.uniform(0.1, 0.97), 1)
        backend = rng.choice(["cpu", "cpu", "metal", "cuda"])
        blas = {"cpu": rng.choice(["openblas", "openblas", "reference"]), "metal": "accelerate"}
        nodes.append(
            {
                "name": name,
                "backend": backend,
                "blas": blas.get(backend, "openblas"),
                "memory_total_gb": total,
                "memory_available_gb": available,
            }
        )
    return {
        "nodes": nodes,
        "total_memory_gb": round(sum(n["memory_total_gb"] for n in nodes), 1),
        "available_memory_gb": round(sum(n["memory_available_gb"] for n in nodes), 1),
        "model": _model_name(rng, random_names),
    }


def _names(names: list[str]) -> str:
    # In backticks a name is the same tokens as in the result's JSON ("name": "...") wherever it
    # stands, so the model learns to copy it token by token (as it copies digits).
    quoted = [f"`{name}`" for name in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def cluster_answer(status: dict[str, Any], aspect: str) -> str:
    names = [str(n["name"]) for n in status["nodes"]]
    count = f"{len(names)} node" + ("s" if len(names) > 1 else "")
    total, available = status["total_memory_gb"], status["available_memory_gb"]
    model = f"`{status['model']}`" if status["model"] else None
    if aspect == "memory":
        return f"Your cluster has {total} GB of memory, {available} GB available."
    if aspect == "nodes":  # each aspect's answer has its own first word: the decision
        return f"There {'is' if len(names) == 1 else 'are'} {count}: {_names(names)}."
    if aspect == "model":
        return f"The loaded model is {model}." if model else "No model is loaded right now."
    loaded = f"the loaded model is {model}" if model else "no model is loaded"
    return (
        f"Overall, your cluster has {count} ({_names(names)}) with {total} GB of memory, "
        f"{available} GB available; {loaded}."
    )


# Cluster questions built from parts too: a lead, a noun phrase per aspect, a tail.
_CLUSTER_LEADS = [
    "tell me ", "show me ", "can you tell me ", "do you know ", "I'd like to know ",
    "I want to know ", "please show ", "let me see ", "check ", "report ", "display ",
    "I need ", "what about ", "could you show me ", "look up ", "find out ",
]  # fmt: skip
_CLUSTER_CORES: dict[str, list[str]] = {
    "memory": [
        "the memory", "the total memory", "the free memory", "my RAM", "the available memory",
        "how much memory there is", "how much RAM I have", "how much memory is free",
        "the memory of my machines", "the memory usage", "how many GB are free",
        "the RAM of the cluster", "how much memory we have", "the memory left",
    ],
    "nodes": [
        "the nodes", "my nodes", "the machines", "which nodes I have", "how many nodes there are",
        "the node names", "the names of my nodes", "the computers in my cluster", "my machines",
        "which machines are online", "the hosts", "which hosts are connected",
        "what machines are connected", "the members of the cluster",
    ],
    "model": [
        "the loaded model", "which model is loaded", "what model is running", "the current model",
        "the model in use", "which model is in use", "the model name", "which model runs",
        "the running model", "what model we are using", "which LLM is loaded",
        "the model on the cluster",
    ],
    "general": [
        "the cluster status", "the status of my cluster", "an overview of my cluster",
        "the state of the cluster", "a report on my cluster", "how my cluster is doing",
        "my setup", "everything about my cluster", "the whole cluster", "the cluster info",
        "a status report", "the state of my machines",
    ],
}  # fmt: skip
_CLUSTER_TAILS = [
    "", "", "", " please", " now", " right now", " for me", " currently", " at the moment",
    " in my cluster", " on my cluster", " across my machines", " today", " quickly",
]  # fmt: skip


def _cluster_frame(rng: random.Random, split: Split, aspect: str) -> str:
    train, heldout = _CLUSTER_FRAMES[aspect]
    if split == "heldout":
        return rng.choice(heldout)
    while True:
        if rng.random() < 0.5:
            frame = rng.choice(train)
        else:
            frame = (
                rng.choice(_CLUSTER_LEADS)
                + rng.choice(_CLUSTER_CORES[aspect])
                + rng.choice(_CLUSTER_TAILS)
            )
        frame = _fill(rng, frame, 0.15)
        if frame not in heldout:
            return frame


def cluster_turns(
    rng: random.Random, split: Split, aspect: str | None = None
) -> tuple[list[dict[str, Any]], str]:
    # Training sees the answers that name nodes (nodes, overview) a bit more often than memory
    # and model; the held-out prompts keep their own mix.
    weights = [3, 4, 3, 4] if split == "train" else [3, 3, 2, 2]
    aspect = aspect or rng.choices(list(_CLUSTER_FRAMES), weights=weights)[0]
    question = _dress(rng, _cluster_frame(rng, split, aspect))
    # Training names nodes with random characters too (the held-out prompts keep the classic
    # names, and so draw the same prompts as before).
    status = cluster_status(rng, random_names=split == "train")
    result = json.dumps(status)
    turns = _tool_turns(question, "cluster_status", {}, result, cluster_answer(status, aspect))
    return turns, aspect


# --------------------------------------------------------------------------- chat (no tool)

_FALLBACK = (
    "Sorry, I am a tiny demo model: I only know about exo-tui, arithmetic, the time and your "
    "cluster. Load a larger model for that."
)
_ABOUT_ME = (
    "I am the exo-tui demo model, a tiny language model that runs offline. I can do arithmetic, "
    "tell you the time and report on your cluster."
)
_FIRST_NAMES = [
    "Maria", "Alex", "Sam", "Priya", "Tom", "Lena", "Kenji", "Fatima", "Omar", "Julia", "Noah",
    "Chen", "Ana", "Lucas", "Emma", "Ravi", "Zoe", "Ivan", "Sofia", "Max", "Nora", "Ali", "Eva",
]  # fmt: skip
_TOPICS = [
    "cats", "the ocean", "black holes", "pizza", "football", "the moon", "trees", "music",
    "coffee", "history", "Paris", "dinosaurs", "winter", "robots", "love", "mountains", "rain",
    "bicycles", "volcanoes", "chess", "the Roman empire", "birds", "chocolate", "electric cars",
    "jazz", "gardening", "poetry", "the internet", "bees", "sushi", "friendship", "Mars",
]  # fmt: skip
_PLACES = ["Paris", "Tokyo", "Berlin", "Lagos", "Lima", "Oslo", "Cairo", "Delhi", "Madrid", "Rome"]

# topic: (training questions, held-out questions, answer); "{n}" is a first name, "{t}" a topic.
_CHAT: dict[str, tuple[list[str], list[str], str]] = {
    "hello": (
        ["hi", "hello", "hey", "good morning", "good evening", "hi there", "hello there", "yo",
         "greetings", "hey there", "good afternoon", "hiya", "morning", "howdy", "hallo"],
        ["hey hey", "hello friend", "good day"],
        "Hello! How can I help you today?",
    ),
    "hello_name": (
        ["hi, I'm {n}", "hello, my name is {n}", "hey, {n} here", "I am {n}", "my name is {n}",
         "hi! call me {n}"],
        ["hello, this is {n}", "{n} here, hi"],
        "Hello {n}! How can I help you today?",
    ),
    "how_are_you": (
        ["how are you", "how are you doing", "how's it going", "how do you do", "are you ok",
         "how are things", "how have you been", "what's up"],
        ["how is your day", "you doing well"],
        "I am fine, thanks! How can I help?",
    ),
    "thanks": (
        ["thanks", "thank you", "thanks a lot", "great, thanks", "cool, thank you", "perfect",
         "nice, thanks", "awesome", "ok thanks", "that helps", "many thanks"],
        ["thank you so much", "cheers"],
        "You're welcome!",
    ),
    "bye": (
        ["bye", "goodbye", "see you", "see you later", "good night", "that's all", "bye bye",
         "I'm done", "talk to you later"],
        ["ciao", "have a good one"],
        "Goodbye! Have a nice day.",
    ),
    "who": (
        ["who are you", "what's your name", "what are you", "are you a robot", "are you human",
         "what model are you", "introduce yourself", "are you an AI", "who made you",
         "what is your name"],
        ["tell me who you are", "what kind of assistant are you"],
        _ABOUT_ME,
    ),
    "can_do": (
        ["what can you do", "help", "what are you able to do", "how can you help me",
         "what do you know", "what tools do you have", "what can I ask you", "which tools can you "
         "use", "what are your skills"],
        ["what are you good at", "show me what you can do"],
        "I can do arithmetic with the calculator, tell you the time with the clock and report on "
        "your cluster's nodes, memory and model. I can also answer questions about exo-tui.",
    ),
    "joke": (
        ["tell me a joke", "make me laugh", "say something funny", "know any jokes",
         "a joke please"],
        ["got a joke for me"],
        "Why did the GPU go to therapy? Too many unresolved layers.",
    ),
    "unknown": (
        ["tell me about {t}", "what do you think of {t}", "write a poem about {t}", "who is {n}",
         "what is the capital of {p}", "what's the weather like in {p}",
         "translate {t} into French",
         "can you recommend a book about {t}", "explain {t}", "do you like {t}", "what is {t}",
         "why is the sky blue", "write me an essay on {t}", "what should I cook tonight",
         "how do I learn {t}", "what is the meaning of life", "is {t} good for you",
         "who won the world cup", "tell me a story about {t}", "what are {t}",
         "how far is {p} from {p2}", "should I buy {t}", "sing a song about {t}",
         "what's the population of {p}", "how old is {n}", "give me a fact about {t}",
         "what is the weather today", "write some code for {t}"],
        ["summarize the history of {t}", "what do you know about {t}", "is it raining in {p}",
         "describe {t}", "how tall is {n}", "teach me about {t}", "who invented {t}"],
        _FALLBACK,
    ),
    # exo-tui, from the README.
    "what_exo": (
        ["what is exo-tui", "what does exo-tui do", "what is this app", "explain exo-tui",
         "what is this program", "tell me about exo-tui", "what's exo-tui for", "what is exo",
         "what am I running", "what does this tool do"],
        ["what is exo-tui exactly", "describe exo-tui"],
        "exo-tui runs one large language model across the machines you already own, managed from "
        "a terminal. Inference is MLX: mlx[cpu] on Linux, Metal on macOS.",
    ),
    "add_node": (
        ["how do I add a node", "how do I add another machine", "how can I add a computer to the "
         "cluster", "how do I connect a second machine", "how do nodes join", "add a node",
         "how do I grow my cluster", "how do I add my laptop to the cluster",
         "how do machines find each other", "how do I add a peer"],
        ["how can I join another computer", "how do I add more machines"],
        "Run `exo-tui node` on the other machine. Nodes on the same network find each other over "
        "mDNS; without multicast, pass `--peer host:port`.",
    ),
    "strategies": (
        ["what strategies are there", "what is pipeline parallelism", "what does the tensor "
         "strategy do", "pipeline or tensor", "explain the strategies", "what is the difference "
         "between pipeline and tensor", "how is the model split", "what is tensor parallelism",
         "how does pipeline mode work", "which strategy should I use"],
        ["how are layers split across nodes", "explain pipeline and tensor"],
        "Pipeline gives each node a contiguous range of layers in proportion to its memory. "
        "Tensor gives every node every layer and splits the heads, so the node count must divide "
        "the number of heads.",
    ),
    "keys": (
        ["what are the keys", "which keys can I use", "keyboard shortcuts", "how do I quit",
         "how do I stop a generation", "what are the key bindings", "how do I open help",
         "list the shortcuts", "what keys does exo-tui have", "how do I open the command palette"],
        ["what hotkeys are there", "how do I exit"],
        "Press ? for help, Esc to stop a generation, ctrl+p for the command palette and ctrl+q to "
        "quit.",
    ),
    "models": (
        ["how do I list models", "which models can I use", "where are models found",
         "how do I pick a model", "how do I use another model", "where do I put models",
         "how do I load a bigger model", "what models are available"],
        ["how can I see my models", "where does exo-tui look for models"],
        "`exo-tui models` lists the models found: the bundled demo, your models folder, the "
        "Hugging Face cache, or a path. `exo-tui chat --model M` picks one.",
    ),
    "headless": (
        ["how do I chat from a script", "is there a headless mode", "how do I use exo-tui without "
         "the TUI", "how do I get JSON output", "can I script exo-tui", "how do I chat in the "
         "shell"],
        ["how do I run one prompt from the command line"],
        "Use `exo-tui chat --prompt TEXT`; add `--json` for JSON Lines, one event per line.",
    ),
    "gpu": (
        ["do I need a GPU", "does it run on CPU", "does exo-tui need a graphics card",
         "does it work on Linux", "does it work on a Mac", "what hardware do I need",
         "is a GPU required"],
        ["can I run it without a GPU"],
        "No GPU needed: on Linux exo-tui runs on the CPU with mlx[cpu] and OpenBLAS; on macOS it "
        "uses Metal.",
    ),
    "start": (
        ["how do I start", "how do I run exo-tui", "how do I get started", "how do I launch it",
         "how do I install exo-tui", "getting started", "how do I start a node"],
        ["how do I begin", "first steps"],
        "Run `make run`, or `exo-tui` once it is installed; `exo-tui node` starts a headless peer "
        "on another machine.",
    ),
}  # fmt: skip
_CHAT_WEIGHTS = {
    "hello": 3, "hello_name": 2, "how_are_you": 2, "thanks": 2, "bye": 1, "who": 2, "can_do": 2,
    "joke": 1, "unknown": 8, "what_exo": 2, "add_node": 2, "strategies": 2, "keys": 2,
    "models": 1, "headless": 1, "gpu": 1, "start": 1,
}  # fmt: skip


def chat_turns(rng: random.Random, split: Split, topic: str | None = None) -> list[dict[str, Any]]:
    topic = topic or rng.choices(list(_CHAT_WEIGHTS), weights=list(_CHAT_WEIGHTS.values()))[0]
    train, heldout, answer = _CHAT[topic]
    fill = {
        "n": rng.choice(_FIRST_NAMES),
        "t": rng.choice(_TOPICS),
        "p": rng.choice(_PLACES),
        "p2": rng.choice(_PLACES),
    }
    question = _dress(rng, _pick(rng, split, train, heldout).format(**fill))
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer.format(**fill)},
    ]


# --------------------------------------------------------------------------- conversations

_SYSTEMS = [
    "You are a helpful assistant.",
    "You are exo-tui's assistant. Be brief.",
    "Answer in one sentence.",
    "You are a helpful assistant running on the user's own machines.",
]


@dataclass
class Conversation:
    intent: Intent
    messages: list[dict[str, Any]]
    tools: bool = True
    meta: dict[str, Any] = field(default_factory=dict)


_INTENT_WEIGHTS: dict[Intent, float] = {
    "calculator": 0.32,
    "clock": 0.11,
    "cluster_status": 0.32,
    "chat": 0.25,
}
_TURNS: dict[Intent, Callable[[random.Random, Split], list[dict[str, Any]]]] = {
    "calculator": lambda rng, split: calculator_turns(rng, split)[0],
    "clock": clock_turns,
    "cluster_status": lambda rng, split: cluster_turns(rng, split)[0],
    "chat": chat_turns,
}


def conversation(rng: random.Random, split: Split = "train") -> Conversation:
    tools = rng.random() < 0.92
    intents: list[Intent] = list(_INTENT_WEIGHTS) if tools else ["chat"]
    weights = list(_INTENT_WEIGHTS.values()) if tools else [1.0]
    intent: Intent = rng.choices(intents, weights=weights)[0]
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.15:
        messages.append({"role": "system", "content": rng.choice(_SYSTEMS)})
    if rng.random() < 0.25:  # an earlier exchange in the same chat
        earlier: Intent = rng.choices(intents, weights=weights)[0]
        messages.extend(_TURNS[earlier](rng, split))
    messages.extend(_TURNS[intent](rng, split))
    return Conversation(intent, messages, tools)


def training_conversations(count: int, seed: int = SEED) -> list[Conversation]:
    rng = random.Random(seed)
    return [conversation(rng, "train") for _ in range(count)]


# --------------------------------------------------------------------------- evaluation set


@dataclass(frozen=True)
class EvalPrompt:
    """A held-out question; `tool` is the tool it needs (None: none), `aspect` what to check."""

    prompt: str
    tool: str | None
    aspect: str = ""
    expression: str = ""


def heldout_prompts(count: int = 200, seed: int = SEED + 1) -> list[EvalPrompt]:
    """Held-out phrasings: tool questions in the intents' proportions, plus chat questions."""
    rng = random.Random(seed)
    prompts: list[EvalPrompt] = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.45:
            turns, calc = calculator_turns(rng, "heldout")
            prompts.append(EvalPrompt(turns[0]["content"], "calculator", "", calc.expression))
        elif roll < 0.6:
            prompts.append(EvalPrompt(clock_turns(rng, "heldout")[0]["content"], "clock", "time"))
        elif roll < 0.85:
            turns, aspect = cluster_turns(rng, "heldout")
            prompts.append(EvalPrompt(turns[0]["content"], "cluster_status", aspect))
        else:
            prompts.append(EvalPrompt(chat_turns(rng, "heldout")[0]["content"], None))
    return prompts


def all_training_phrasings() -> set[str]:
    """Every core training phrasing, to check that held-out ones never leak into training."""
    found = set(_CALC_FRAMES[0]) | set(_CLOCK_FRAMES[0])
    for lead in _CALC_LEADS:
        found |= {lead + verb + tail for verb in _CALC_VERBS for tail in _CALC_TAILS}
    for ask in _CALC_ASKS:
        found |= {ask + question + tail for question in _CALC_QUESTIONS for tail in _CALC_TAILS}
    for lead in _CLOCK_LEADS:
        found |= {lead + core + tail for core in _CLOCK_CORES for tail in _CLOCK_TAILS}
    found |= set(_CLOCK_EXTRA)
    for train, _ in _CLUSTER_FRAMES.values():
        found |= set(train)
    for cores in _CLUSTER_CORES.values():
        for lead in _CLUSTER_LEADS:
            found |= {lead + core + tail for core in cores for tail in _CLUSTER_TAILS}
    for train, _, _ in _CHAT.values():
        found |= set(train)
    for train, _ in _OPERATORS.values():
        found |= set(train)
    return found


def all_heldout_phrasings() -> set[str]:
    found = set(_CALC_FRAMES[1]) | set(_CLOCK_FRAMES[1])
    for _, heldout in _CLUSTER_FRAMES.values():
        found |= set(heldout)
    for _, heldout, _ in _CHAT.values():
        found |= set(heldout)
    for _, heldout in _OPERATORS.values():
        found |= set(heldout)
    return found


def main() -> None:
    rng = random.Random(SEED)
    for _ in range(8):
        c = conversation(rng)
        print(c.intent, json.dumps(c.messages, ensure_ascii=False)[:400])
    for p in heldout_prompts(10):
        print(p)


if __name__ == "__main__":
    main()
