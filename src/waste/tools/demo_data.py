"""Synthetic XTML conversations for the embedded demo model: the task families, the held-out
split, and the graders.

Every conversation is an OpenAI request body plus the reply the model should write. The
prompt side goes through the server's own request parser and renderer (``demo_domain``),
so training prompts are byte-identical to what ``waste`` sends the engine; the reply side is
rendered by the same renderer and must parse back, by token, to the intended message.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Callable, Iterator

import attrs

# -- the tool the model knows ------------------------------------------------------------

GET_TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "description": "IANA time zone, e.g. Europe/Paris"}},
            "required": ["tz"],
        },
    },
}

CITIES = {
    "Tokyo": "Asia/Tokyo", "Osaka": "Asia/Tokyo", "Seoul": "Asia/Seoul", "Beijing": "Asia/Shanghai",
    "Shanghai": "Asia/Shanghai", "Hong Kong": "Asia/Hong_Kong", "Singapore": "Asia/Singapore",
    "Bangkok": "Asia/Bangkok", "Jakarta": "Asia/Jakarta", "Manila": "Asia/Manila",
    "Delhi": "Asia/Kolkata", "Mumbai": "Asia/Kolkata", "Karachi": "Asia/Karachi",
    "Dubai": "Asia/Dubai", "Tehran": "Asia/Tehran", "Istanbul": "Europe/Istanbul",
    "Moscow": "Europe/Moscow", "Kyiv": "Europe/Kyiv", "Warsaw": "Europe/Warsaw",
    "Berlin": "Europe/Berlin", "Paris": "Europe/Paris", "London": "Europe/London",
    "Madrid": "Europe/Madrid", "Rome": "Europe/Rome", "Vienna": "Europe/Vienna",
    "Amsterdam": "Europe/Amsterdam", "Stockholm": "Europe/Stockholm", "Oslo": "Europe/Oslo",
    "Helsinki": "Europe/Helsinki", "Lisbon": "Europe/Lisbon", "Dublin": "Europe/Dublin",
    "Athens": "Europe/Athens", "Prague": "Europe/Prague", "Zurich": "Europe/Zurich",
    "Cairo": "Africa/Cairo", "Lagos": "Africa/Lagos", "Nairobi": "Africa/Nairobi",
    "Johannesburg": "Africa/Johannesburg", "Casablanca": "Africa/Casablanca",
    "New York": "America/New_York", "Chicago": "America/Chicago", "Denver": "America/Denver",
    "Los Angeles": "America/Los_Angeles", "Toronto": "America/Toronto",
    "Vancouver": "America/Vancouver", "Mexico City": "America/Mexico_City",
    "Bogota": "America/Bogota", "Lima": "America/Lima", "Santiago": "America/Santiago",
    "Buenos Aires": "America/Argentina/Buenos_Aires", "Sao Paulo": "America/Sao_Paulo",
    "Sydney": "Australia/Sydney", "Melbourne": "Australia/Melbourne", "Perth": "Australia/Perth",
    "Auckland": "Pacific/Auckland", "Honolulu": "Pacific/Honolulu", "Anchorage": "America/Anchorage",
    "Reykjavik": "Atlantic/Reykjavik",
}

WORDS = tuple("""
apple table chair house water light green river stone cloud bread music paper plant
horse mouse bird fish tree leaf rain snow wind fire earth metal glass sugar salt lemon
orange grape melon peach cherry berry honey butter cheese pepper onion garlic carrot tomato
potato rice pasta pizza soup salad coffee tea milk juice cake cookie candy bottle cup plate
spoon fork knife bowl door window floor wall roof garden street city road bridge tower
castle king queen prince knight dragon wizard magic story book page letter word number
planet star moon sun comet rocket robot engine motor wheel train plane boat ship truck
bike car bus taxi ticket money coin bank market shop store price gift party dance song
voice sound noise quiet smile laugh happy sad angry brave calm clever kind quick slow
bright dark warm cold soft hard heavy small large little big tall short long round flat
purple yellow silver golden black white brown pink blue red circle square line point
shape color paint brush pencil eraser desk lamp clock watch phone camera screen mouse
keyboard cable socket switch button signal radio video movie actor stage theater circus
tiger lion zebra monkey rabbit turtle snake frog whale shark eagle owl duck goose sheep
goat cow pig dog cat puppy kitten pony camel llama panda koala otter beaver badger
forest desert ocean island valley canyon mountain hill beach coast lake pond field
winter summer spring autumn morning evening night today friday monday sunday
doctor nurse teacher farmer baker pilot sailor artist writer singer driver judge
hammer nail screw drill saw ladder rope chain lock key box basket bag pocket jacket
shirt dress skirt shoe boot sock glove scarf hat cap ring necklace crown mask
pocket marble puzzle riddle secret answer question reason idea dream memory future
simple system kernel server client packet buffer thread socket module vector matrix
""".split())
WORDS = tuple(dict.fromkeys(WORDS))  # first occurrence wins; a word listed twice is one word

SYSTEM_PROMPTS = ("You are a helpful assistant.", "You are a concise assistant.",
                  "Answer briefly.", "You are a friendly helper. Think step by step.")

INTRO = ("I am the waste demo model, a tiny Kimi-Linear trained in half an hour. I can add and "
         "subtract numbers up to 99, multiply single digits, reverse or capitalize a word, and "
         "tell the time in a city with the get_time tool. I know nothing else.")
GREETING = ("Hello! I am the waste demo model. Ask me to add, subtract or multiply small numbers, "
            "to reverse or capitalize a word, or for the time in a city.")

ADD_Q = ("What is {a} plus {b}?", "What is {a} + {b}?", "{a} + {b} = ?", "Add {a} and {b}.",
         "What's the sum of {a} and {b}?", "Compute {a} + {b}.", "Calculate {a} plus {b}.",
         "How much is {a} plus {b}?")
SUB_Q = ("What is {a} minus {b}?", "What is {a} - {b}?", "{a} - {b} = ?", "Subtract {b} from {a}.",
         "What's {a} minus {b}?", "Compute {a} - {b}.", "Calculate {a} minus {b}.",
         "How much is {a} minus {b}?")
MUL_Q = ("What is {a} times {b}?", "What is {a} * {b}?", "{a} * {b} = ?", "Multiply {a} by {b}.",
         "What's {a} × {b}?", "Compute {a} × {b}.", "What is the product of {a} and {b}?",
         "How much is {a} times {b}?")
REV_Q = ("Reverse the word {w}.", "Spell {w} backwards.", "What is {w} reversed?",
         "Reverse \"{w}\".", "Write {w} backwards.", "Can you reverse the word {w}?")
UP_Q = ("Write {w} in capital letters.", "Uppercase the word {w}.", "Make \"{w}\" uppercase.",
        "What is {w} in uppercase?", "Capitalize every letter of {w}.", "Write the word {w} in caps.")
# Greetings, like the who-questions below, are a core greeting with an ending; the held-out
# ones are (core, ending) pairs never trained on, each core being trained with other endings
# (a bare core is always trained). A one-word greeting never seen at all is indistinguishable
# from a made-up word to reverse.
GREET_CORE = ("Hello", "Hi", "Hi there", "Hey", "Good morning", "Hello, how are you", "Hey there",
              "Good evening", "Hiya", "Greetings", "Good afternoon", "Howdy")
GREET_ENDINGS = ("", "!", ".", " :)", "!!", " everyone", " friend!")
GREET_Q = tuple(c + e for c in GREET_CORE for e in GREET_ENDINGS)
# "Who are you" questions are a core question after an optional opener; the held-out ones
# are (opener, core) pairs never trained on, each core being trained with other openers.
WHO_CORE = ("Who are you?", "What are you?", "What can you do?", "Introduce yourself.",
            "Tell me about yourself.", "What do you know?", "What are you good at?",
            "What is your name?", "Which model are you?", "What can you help me with?",
            "Are you a bot?", "Who made you?")
WHO_OPENERS = ("", "Hi! ", "Hello. ", "Hey. ", "Excuse me. ", "One question. ")
WHO_Q = tuple(o + c for o in WHO_OPENERS for c in WHO_CORE)
TIME_Q = ("What time is it in {c}?", "What's the time in {c}?", "Tell me the time in {c}.",
          "Current time in {c}?", "What time is it in {c} right now?", "Do you know the time in {c}?",
          "What is the local time in {c}?")

FAMILIES = ("add", "sub", "mul", "reverse", "upper", "greet", "who", "time_call", "time_result")
# Training mixture (weights); the held-out set takes every family in equal shares.
MIXTURE = {"add": 16, "sub": 14, "mul": 12, "reverse": 24, "upper": 20, "greet": 4, "who": 5,
           "time_call": 7, "time_result": 7}
HELD_OUT_PERCENT = 12
# Share of reverse/upper training questions on a made-up word (see ``pseudo_word``).
PSEUDO_WORD_SHARE = 0.6


def _held_out(*key) -> bool:
    """Deterministic split by question: a stable hash of the key, not Python's salted one."""
    digest = hashlib.sha256(repr(key).encode("utf-8")).digest()
    return digest[0] * 100 // 256 < HELD_OUT_PERCENT


@attrs.frozen(kw_only=True)
class Reply:
    """The assistant message the model should write."""

    reasoning: str
    content: str
    calls: tuple[tuple[str, dict], ...] = ()

    def message(self) -> dict:
        """As an OpenAI assistant message (the renderer's input)."""
        msg: dict = {"role": "assistant", "content": self.content, "reasoning_content": self.reasoning}
        if self.calls:
            msg["tool_calls"] = [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args)}}
                for i, (name, args) in enumerate(self.calls)]
        return msg


@attrs.frozen(kw_only=True)
class Example:
    """One conversation: the request body the client sends and the reply it should get."""

    family: str
    body: dict
    reply: Reply


# -- the families: (question key, user text, reply) ----------------------------------------

def _add(a: int, b: int) -> Reply:
    ones = a % 10 + b % 10
    tens = a // 10 + b // 10 + ones // 10
    return Reply(reasoning=f"Addition. {a} + {b}: ones {a % 10} + {b % 10} = {ones}, tens {a // 10} + "
                           f"{b // 10} + {ones // 10} = {tens}. So {a} + {b} = {a + b}.",
                 content=f"{a} + {b} = {a + b}.")


def _sub(a: int, b: int) -> Reply:
    if a % 10 >= b % 10:
        ones, borrow = f"ones {a % 10} - {b % 10} = {a % 10 - b % 10}", 0
    else:
        ones, borrow = f"ones {a % 10} - {b % 10} needs a borrow, {a % 10 + 10} - {b % 10} = {a % 10 + 10 - b % 10}", 1
    tens = f"tens {a // 10} - {b // 10} - {borrow} = {a // 10 - b // 10 - borrow}"
    return Reply(reasoning=f"Subtraction. {a} - {b}: {ones}, {tens}. So {a} - {b} = {a - b}.",
                 content=f"{a} - {b} = {a - b}.")


def _mul(a: int, b: int) -> Reply:
    """Counted out loud in a canonical order: the larger factor, counted up to the smaller,
    named first (``counted as 7 × 2``) so that the count stops where a line repeats it.
    ``a × b`` and ``b × a`` share their chain, so a held-out order whose mirror is trained is
    answered by commutativity, not recalled (docs/DECISIONS.md, issue 10)."""
    big, small = max(a, b), min(a, b)
    if small == 0:
        steps = "anything times 0 is 0"
    else:
        steps = ", ".join(f"{big} × {i} = {big * i}" for i in range(1, small + 1))
    return Reply(reasoning=f"Multiplication. {a} × {b}, counted as {big} × {small}: {steps}. "
                           f"So {a} × {b} = {a * b}.",
                 content=f"{a} × {b} = {a * b}.")


def _reverse(w: str) -> Reply:
    r = w[::-1]
    return Reply(reasoning=f"Reverse. {w}: {'-'.join(w)}. Backwards: {'-'.join(r)}. So {w} reversed is {r}.",
                 content=f"{w} reversed is {r}.")


def _upper(w: str) -> Reply:
    u = w.upper()
    return Reply(reasoning=f"Uppercase. {w}: {'-'.join(w)}. Capitals: {'-'.join(u)}. So {w} in capitals is {u}.",
                 content=f"{w} in capitals is {u}.")


def _time_call(city: str) -> Reply:
    tz = CITIES[city]
    return Reply(reasoning=f"Time. {city} is in the time zone {tz}, so I call get_time.",
                 content="", calls=(("get_time", {"tz": tz}),))


def _time_answer(city: str, hhmm: str) -> Reply:
    return Reply(reasoning=f"Tool result. get_time says {hhmm} in {CITIES[city]}.",
                 content=f"It is {hhmm} in {city}.")


def _training_words() -> tuple[str, ...]:
    return tuple(w for w in WORDS if not _held_out("word", w))


def _letter_model() -> dict[str, tuple[str, ...]]:
    """Order-2 letter continuations of the training-side words ("^" starts, "$" ends a word)."""
    follow: dict[str, list[str]] = {}
    for w in _training_words():
        padded = "^^" + w + "$"
        for i in range(len(w) + 1):
            follow.setdefault(padded[i:i + 2], []).append(padded[i + 2])
    return {k: tuple(v) for k, v in follow.items()}


_LETTERS = _letter_model()
_ALL_WORDS = frozenset(WORDS)


def pseudo_word(rng: random.Random) -> str:
    """A made-up, word-like string of 3 to 8 letters that is not in ``WORDS``.

    A few hundred real words are too few to learn spelling from: the model memorises them and
    answers a new word with an old one. Word-like strings drawn from the training words' letter
    statistics put every spelling piece of the vocabulary in countless new combinations, so
    reversing and upper-casing must work letter by letter."""
    while True:
        w, state = "", "^^"
        while True:
            c = rng.choice(_LETTERS[state])
            if c == "$" or len(w) == 8:
                break
            w, state = w + c, state[1] + c
        if 3 <= len(w) <= 8 and w not in _ALL_WORDS:
            return w


@attrs.frozen
class LetterPieces:
    """A vocabulary's lower-case letter pieces and how it cuts a word: ``cut(" " + w)`` is the
    pieces of a word as it follows a space (the vocabulary is demo_train's; this module does
    not tokenize)."""

    pieces: tuple[str, ...]
    cut: Callable[[str], list[str]]


def piece_word(rng: random.Random, vocab: LetterPieces) -> str:
    """A made-up word of 3 to 8 letters made of two or three letter pieces drawn evenly from
    the vocabulary (the first may carry the word's space, or the word starts with a lone
    space), kept only when the vocabulary cuts the word into exactly those pieces: the second
    training phase's made-up words. The letter statistics of ``pseudo_word`` seldom make a
    rare piece (`fu`, `ort`: a few times in 2,000 words), and an unseen word made of one was
    miscopied and misspelled; drawn evenly, each of the ~500 pieces comes ~10 times a 1,000
    words."""
    inner = [p for p in vocab.pieces if not p.startswith(" ")]
    while True:
        first = rng.choice(vocab.pieces)
        parts = [first] + [rng.choice(inner) for _ in range(rng.randint(1, 2))]
        w = "".join(p.lstrip(" ") for p in parts)
        cut = parts if first.startswith(" ") else [" ", *parts]
        if 3 <= len(w) <= 8 and w not in _ALL_WORDS and vocab.cut(" " + w) == cut:
            return w


def _is_held_out(family: str, key: tuple, text: str) -> bool:
    if key[0] == "pseudo":  # made-up words are training material only
        return False
    if family == "greet":  # a bare core greeting is always trained
        return key[2] != "" and _held_out(*key)
    if family == "mul":  # one order of some pairs; its mirror (and every square) is trained
        a, b = key[1], key[2]
        if a == b:
            return False
        first = min(a, b) if _held_out("mul-order", min(a, b), max(a, b)) else max(a, b)
        return a == first and _held_out("mul", min(a, b), max(a, b))
    return _held_out(*key)


def _question(family: str, rng: random.Random, held_out: bool,
              pieces: LetterPieces | None = None) -> tuple[str, Reply, tuple]:
    """(user text, reply, question key) for one family, drawn from the requested side of the
    split; with ``pieces``, the made-up words are ``piece_word``s."""
    key: tuple[object, ...]
    while True:
        if family == "add":
            a, b, q = rng.randrange(100), rng.randrange(100), rng.randrange(len(ADD_Q))
            key, text, reply = ("add", a, b), ADD_Q[q].format(a=a, b=b), _add(a, b)
        elif family == "sub":
            a, b, q = rng.randrange(100), rng.randrange(100), rng.randrange(len(SUB_Q))
            a, b = max(a, b), min(a, b)
            key, text, reply = ("sub", a, b), SUB_Q[q].format(a=a, b=b), _sub(a, b)
        elif family == "mul":
            a, b, q = rng.randrange(10), rng.randrange(10), rng.randrange(len(MUL_Q))
            key, text, reply = ("mul", a, b), MUL_Q[q].format(a=a, b=b), _mul(a, b)
        elif family in ("reverse", "upper"):
            if not held_out and rng.random() < PSEUDO_WORD_SHARE:
                w = piece_word(rng, pieces) if pieces else pseudo_word(rng)
                key = ("pseudo", w)
            else:
                w = rng.choice(WORDS)
                key = ("word", w)
            qs = REV_Q if family == "reverse" else UP_Q
            text = rng.choice(qs).format(w=w)
            reply = _reverse(w) if family == "reverse" else _upper(w)
        elif family == "greet":
            core, ending = rng.choice(GREET_CORE), rng.choice(GREET_ENDINGS)
            text = core + ending
            key, reply = ("greet", core, ending), Reply(
                reasoning="Greeting. The user says hello, so I greet back and say what I can do.",
                content=GREETING)
        elif family == "who":
            text = rng.choice(WHO_Q)
            key, reply = ("who", text), Reply(
                reasoning="Identity. The user asks about me, so I say what I am and what I know.",
                content=INTRO)
        elif family in ("time_call", "time_result"):
            # A city's zone cannot be inferred from its name: every city is trained; the split
            # is by (city, phrasing).
            city, q = rng.choice(sorted(CITIES)), rng.randrange(len(TIME_Q))
            key, text = ("time", city, q), TIME_Q[q].format(c=city)
            reply = _time_call(city)
        else:
            raise ValueError(f"unknown family {family!r}")
        if _is_held_out(family, key, text) == held_out:
            return text, reply, key


WORD_TASKS = ("reverse", "upper")


def _prior_exchange(rng: random.Random, word_tasks: bool) -> list[dict]:
    """An earlier, unrelated exchange (always from the training side)."""
    family = rng.choice(("add", "sub", "mul", "greet") + (WORD_TASKS if word_tasks else ()))
    text, reply, _ = _question(family, rng, held_out=False)
    assistant: dict = {"role": "assistant", "content": reply.content}
    if rng.random() < 0.5:
        assistant["reasoning_content"] = reply.reasoning
    return [{"role": "user", "content": text}, assistant]


def make_example(family: str, rng: random.Random, *, held_out: bool, word_tasks: bool = True,
                 pieces: LetterPieces | None = None) -> Example:
    """One conversation of ``family`` with a random context (system prompt, tool declaration,
    an earlier exchange, a reasoning effort); without ``word_tasks``, the earlier exchange is
    never a reversing or upper-casing one; ``pieces`` as ``_question`` takes them."""
    text, reply, key = _question(family, rng, held_out, pieces)
    messages: list[dict] = []
    if rng.random() < 0.2:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    if rng.random() < 0.2:
        messages += _prior_exchange(rng, word_tasks)
    messages.append({"role": "user", "content": text})
    body: dict = {"model": "waste", "messages": messages}
    if family.startswith("time") or rng.random() < 0.2:
        body["tools"] = [GET_TIME_TOOL]
    effort = rng.random()
    if effort < 0.1:
        body["reasoning_effort"] = "low"
    elif effort < 0.2:
        body["reasoning_effort"] = "high"
    if family == "time_result":
        city = key[1]
        call_msg = _time_call(city).message()
        call_msg["content"] = rng.choice(("", None))
        call_msg["tool_calls"][0]["id"] = f"call_{rng.getrandbits(48):012x}"
        if rng.random() < 0.5:
            del call_msg["reasoning_content"]
        hhmm = f"{rng.randrange(24):02d}:{rng.randrange(60):02d}"
        result = hhmm if rng.random() < 0.6 else json.dumps({"tz": CITIES[city], "time": hhmm})
        messages += [call_msg, {"role": "tool", "tool_call_id": call_msg["tool_calls"][0]["id"],
                                "content": result}]
        reply = _time_answer(city, hhmm)
    return Example(family=family, body=body, reply=reply)


def training_examples(seed: int, step: int, n: int, pieces: LetterPieces | None = None) -> list[Example]:
    """The ``n`` training conversations of ``step``: a pure function of (seed, step, pieces)."""
    rng = random.Random(f"demo-train/{seed}/{step}")
    families = list(MIXTURE)
    weights = [MIXTURE[f] for f in families]
    return [make_example(rng.choices(families, weights)[0], rng, held_out=False, pieces=pieces)
            for _ in range(n)]


def held_out_examples(seed: int, per_family: int) -> list[Example]:
    """``per_family`` held-out conversations of every family (questions never trained on)."""
    rng = random.Random(f"demo-heldout/{seed}")
    return [make_example(family, rng, held_out=True) for family in FAMILIES for _ in range(per_family)]


def corpus_texts(seed: int, n: int) -> Iterator[str]:
    """Plain text of ``n`` training conversations (prompt and reply), for the BPE trainer.

    The word tasks' conversations are left out: merges then serve the templates, numbers and
    cities, and the words to reverse or upper-case split into short pieces (mostly single
    letters) whose spelling the model can learn, instead of whole-word tokens it can only
    memorise."""
    from waste.tools.demo_domain import plain_texts

    rng = random.Random(f"demo-corpus/{seed}")
    families = [f for f in MIXTURE if f not in WORD_TASKS]
    weights = [MIXTURE[f] for f in families]
    for _ in range(n):
        ex = make_example(rng.choices(families, weights)[0], rng, held_out=False, word_tasks=False)
        yield from plain_texts(ex)


# -- grading ---------------------------------------------------------------------------------

def grade(example: Example, message: dict) -> tuple[bool, bool]:
    """(well formed, correct) for an OpenAI response ``message`` to ``example``.

    Well formed: reasoning in ``reasoning_content``; content present for an answer, tool calls
    (with JSON-object arguments) for a call, never both. Correct: the exact expected reply
    (content, or the call's name and arguments).
    """
    reasoning = message.get("reasoning_content") or ""
    content = message.get("content") or ""
    calls = message.get("tool_calls") or []
    expected = example.reply
    if expected.calls:
        well = bool(reasoning.strip()) and len(calls) == 1 and not content.strip()
        if not well:
            return False, False
        fn = calls[0].get("function", {})
        try:
            args = json.loads(fn.get("arguments", ""))
        except ValueError:
            return False, False
        if not isinstance(args, dict):
            return False, False
        name, want = expected.calls[0]
        return True, fn.get("name") == name and args == want
    well = bool(reasoning.strip()) and bool(content.strip()) and not calls
    return well, well and content == expected.content
