"""Long-context retrieval tasks (`longctx.*`), in the style of RULER, with exact scorers.

Every task exists at several context lengths, named `longctx.<op>@<k>k` (e.g. `longctx.passkey@4k`): the prompt
is filled to about that many tokens of the zoo tokenizer (`CONTEXTS`; a test checks the fill within 10 %). The
filler is RULER's "noise" haystack (the same five sentences repeated) or, for the list and key-value tasks, the
records themselves. The answer is short and only one string is right:

- `passkey`: one "pass key" (5 digits) hidden at a random depth of the noise (landmark-attention / Quest passkey);
- `multikey`: four "special numbers" of four people (7 digits) hidden in the noise, one of them asked for;
- `kv`: the whole context is `key XXXXX value NNNNN.` records, one key asked for (RULER's key-value retrieval);
- `vartrack`: a chain `VAR A = 12345.`, `VAR B = VAR A.`, ... of five variables scattered in the noise; the answer
  names every variable holding the value, in chain order (RULER's variable tracking, one chain, four hops);
- `after`: a long waiting line of names (the `lists.*` name pool); "who comes after NAME?".

Long tasks live in their own registry (`LONG_TASKS`): the zoo's training and decontamination read every item of
`TASKS`, and thousands of 16k-token prompts do not belong there.
"""

from __future__ import annotations

import random
import string

from .base import Item, Task
from .lists import FIRST_NAMES, LAST_NAMES

# context lengths a task is registered at (tokens of the zoo tokenizer)
CONTEXTS = {"1k": 1024, "2k": 2048, "4k": 4096, "8k": 8192, "16k": 16384}
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
# measured with zoo:ar-small's tokenizer: tokens per character of each kind of filler
_NOISE_TOKENS_PER_CHAR = 36 / 90
_OVERHEAD = 60  # tokens of question, template and needles, roughly


def _digits(rng: random.Random, n: int) -> str:
    return str(rng.randint(10 ** (n - 1), 10**n - 1))


def _word(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(n))


def _haystack(rng: random.Random, tokens: int, needles: list[str]) -> str:
    """Noise of about `tokens` tokens with `needles` inserted, in order, at sorted random depths."""
    units = max(1, round(tokens / (len(NOISE) * _NOISE_TOKENS_PER_CHAR)))
    depths = sorted(rng.randint(0, units) for _ in needles)
    parts: list[str] = []
    d = 0
    for u in range(units + 1):
        while d < len(needles) and depths[d] == u:
            parts.append(needles[d] + " ")
            d += 1
        if u < units:
            parts.append(NOISE)
    return "".join(parts).strip()


class LongTask(Task):
    op = ""
    answer_tokens = 16

    def __init__(self, size: str) -> None:
        self.size = size
        self.context = CONTEXTS[size]
        super().__init__(f"longctx.{self.op}@{size}", deterministic=True, max_new_tokens=self.answer_tokens)

    def score(self, item: Item, output: str) -> float:
        return float(_first_line(output) == item.reference)


def _first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip()


class PasskeyTask(LongTask):
    op = "passkey"

    def make_item(self, rng: random.Random) -> Item:
        key = _digits(rng, 5)
        needle = f"The pass key is {key}. Remember it. {key} is the pass key."
        text = _haystack(rng, self.context - _OVERHEAD, [needle])
        prompt = f"There is a pass key hidden in this text. {text}\nWhat is the pass key?"
        return self.item(prompt, key, key=key)


def _people(rng: random.Random, n: int) -> list[str]:
    """`n` distinct "First Last" names (n <= 3600)."""
    pairs = rng.sample(range(len(FIRST_NAMES) * len(LAST_NAMES)), n)
    return [f"{FIRST_NAMES[p // len(LAST_NAMES)]} {LAST_NAMES[p % len(LAST_NAMES)]}" for p in pairs]


class MultikeyTask(LongTask):
    op = "multikey"
    keys = 4

    def make_item(self, rng: random.Random) -> Item:
        people = _people(rng, self.keys)
        numbers = [_digits(rng, 7) for _ in people]
        needles = [f"The special number of {p} is {n}." for p, n in zip(people, numbers, strict=True)]
        rng.shuffle(needles)
        asked = rng.randrange(self.keys)
        text = _haystack(rng, self.context - _OVERHEAD, needles)
        prompt = f"Special numbers are hidden in this text. {text}\nWhat is the special number of {people[asked]}?"
        return self.item(prompt, numbers[asked], person=people[asked])


class KeyValueTask(LongTask):
    op = "kv"
    _tokens_per_record = 13.7  # "key QWERT value 12345. " with the zoo tokenizer, about

    def make_item(self, rng: random.Random) -> Item:
        n = max(2, int((self.context - _OVERHEAD) / self._tokens_per_record))
        keys: list[str] = []
        seen: set[str] = set()
        while len(keys) < n:
            k = _word(rng)
            if k not in seen:
                seen.add(k)
                keys.append(k)
        values = [_digits(rng, 5) for _ in keys]
        asked = rng.randrange(n)
        records = " ".join(f"key {k} value {v}." for k, v in zip(keys, values, strict=True))
        prompt = f"Remember the value of every key. {records}\nWhat is the value of key {keys[asked]}?"
        return self.item(prompt, values[asked], key=keys[asked])


class VariableTrackingTask(LongTask):
    op = "vartrack"
    answer_tokens = 32
    hops = 4

    def make_item(self, rng: random.Random) -> Item:
        names: list[str] = []
        while len(names) < self.hops + 1:
            w = _word(rng)
            if w not in names:
                names.append(w)
        value = _digits(rng, 5)
        lines = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:], strict=False)]
        text = _haystack(rng, self.context - _OVERHEAD, lines)
        prompt = f"Track the variables in this text. {text}\nWhich variables are assigned the value {value}?"
        return self.item(prompt, ", ".join(names), names=names, value=value)

    def score(self, item: Item, output: str) -> float:
        got = [w.strip().strip(".") for w in _first_line(output).split(",")]
        return float(sorted(w for w in got if w) == sorted(item.data["names"]))


class AfterTask(LongTask):
    op = "after"
    _tokens_per_person = 3.07  # "Kevin Evans, " with the zoo tokenizer, about

    def make_item(self, rng: random.Random) -> Item:
        n = max(3, int((self.context - _OVERHEAD) / self._tokens_per_person))
        pool = len(FIRST_NAMES) * len(LAST_NAMES)
        line = _people(rng, min(n, pool))
        while len(line) < n:  # longer than the pool: repeats, but the asked person stays unique (below)
            line.extend(_people(rng, min(n - len(line), pool)))
        asked = rng.randrange(n - 1)
        person = line[asked]
        line = [p for i, p in enumerate(line) if p != person or i == asked]  # the asked person appears once
        asked = min(line.index(person), len(line) - 2)
        person = line[asked]
        answer = line[asked + 1]
        prompt = f"This is a waiting line. {', '.join(line)}.\nWho comes after {person} in the waiting line?"
        return self.item(prompt, answer, person=person)


OPS = (PasskeyTask, MultikeyTask, KeyValueTask, VariableTrackingTask, AfterTask)
TASKS = tuple(cls(size) for size in CONTEXTS for cls in OPS)
