"""The built-in preference pairs (``data.builtin=preference``): generated here, prepared on first
use, never downloaded.

600 pairs from a seeded generator over the built-in chat data's questions
(``launcher.data.chat.builtin_chat``: arithmetic, reversing and spelling words, capitals, counting
letters), each with the right answer as ``chosen`` and a wrong one in the same format as
``rejected`` (a sum off by one to three, the word unreversed or another word reversed, one letter
misspelt, another country's capital, a wrong count). Records are in TRL's conversational format
(``prompt`` a message list, sometimes with a system message; ``chosen`` / ``rejected`` one
assistant message each), prepared with the same byte-level ChatML tokenizer, so a model trained
on ``data.builtin=chat`` (model.vocab_size >= 259) is the base to start from. 5% of the pairs
are held out for validation. The prepared folder (``pairs-tiny-v1`` under the cache root) is an
ordinary ``data prepare --input-format preference`` output for ``data.path``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from launcher.data.chat.builtin_chat import _CAPITALS, _SYSTEMS, _WORDS, prepared_builtin

BUILTIN_PREFERENCE = "pairs-tiny-v1"
PAIRS = 600


def _misspelt(word: str, rng: random.Random) -> str:
    i = rng.randrange(len(word))
    other = rng.choice([c for c in "abcdefghijklmnopqrstuvwxyz" if c != word[i]])
    return word[:i] + other + word[i + 1 :]


def _pair(rng: random.Random) -> tuple[str, str, str]:
    """(question, right answer, wrong answer)."""
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randrange(10), rng.randrange(10)
        off = a + b + rng.choice((-3, -2, -1, 1, 2, 3))
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}.", f"{a} + {b} = {off}."
    word = rng.choice(_WORDS)
    if kind == 1:
        other = rng.choice([w for w in _WORDS if w != word])
        wrong = word if rng.random() < 0.5 else other[::-1]
        return f"Reverse the word {word}.", word[::-1], wrong
    if kind == 2:
        return f"Spell {word}.", "-".join(word.upper()), "-".join(_misspelt(word, rng).upper())
    if kind == 3:
        (country, city), (_, wrong_city) = rng.sample(_CAPITALS, 2)
        right = f"The capital of {country} is {city}."
        return f"What is the capital of {country}?", right, right.replace(city, wrong_city)
    letter = rng.choice(word)
    count = word.count(letter)
    wrong_count = count + rng.choice((1, 2)) if count == 1 else count - 1
    return (
        f"How many {letter} in {word}?",
        f"{count} {letter} in {word}.",
        f"{wrong_count} {letter} in {word}.",
    )


def pairs(count: int = PAIRS, seed: int = 0) -> list[dict[str, Any]]:
    """The generated records, the same on every machine."""
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        prompt: list[dict[str, str]] = []
        if rng.random() < 0.3:
            prompt.append({"role": "system", "content": rng.choice(_SYSTEMS)})
        question, right, wrong = _pair(rng)
        prompt.append({"role": "user", "content": question})
        records.append(
            {
                "prompt": prompt,
                "chosen": [{"role": "assistant", "content": right}],
                "rejected": [{"role": "assistant", "content": wrong}],
            }
        )
    return records


def builtin_preference_dir(cache_root: Path, timeout_s: float = 600.0) -> Path:
    """The prepared built-in preference pairs under `cache_root` (made once, under a lock)."""
    source = {"kind": "builtin-preference", "pairs": PAIRS}
    records = pairs()
    return prepared_builtin(
        cache_root, BUILTIN_PREFERENCE, "pairs.jsonl", records, "preference", source, timeout_s
    )
