"""The built-in chat dataset (``data.builtin=chat``): generated here, prepared on first use.

A few hundred short conversations from a fixed generator (no randomness outside a seeded
``random.Random``, so every machine makes the same bytes): arithmetic, reversing and spelling
words, capitals, counting letters, sometimes with a system message or a second turn. Every answer
is a function of its question, so a model that learns it shows a falling loss on the assistant
tokens. The tokenizer is byte-level (256 byte tokens, as the byte tokenizer, ids 0..255) plus three
special tokens, ``<|endoftext|>`` 256, ``<|im_start|>`` 257, ``<|im_end|>`` 258, with a ChatML chat
template: model.vocab_size must be at least ``VOCAB_SIZE`` (259).

The prepared folder (``chat-tiny-v1`` under the cache root) is an ordinary ``data prepare``
output: ``data.path=~/.cache/llmtrain/chat-tiny-v1`` names it as any chat dataset.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

BUILTIN_CHAT = "chat-tiny-v1"
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 256 + len(SPECIALS)
CONVERSATIONS = 600
# ChatML (the convention of OpenAI's ChatML and Qwen's templates), without a default system text.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_WORDS = (
    "cat", "dog", "sun", "tree", "moon", "star", "fish", "bird", "rain", "snow", "lamp", "door",
    "book", "cake", "ship", "road", "milk", "wind", "leaf", "rock", "ring", "bell", "king", "salt",
)  # fmt: skip
_CAPITALS = (
    ("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
    ("Egypt", "Cairo"), ("Peru", "Lima"), ("Kenya", "Nairobi"), ("Chile", "Santiago"),
    ("Norway", "Oslo"), ("Greece", "Athens"), ("Canada", "Ottawa"), ("Cuba", "Havana"),
)  # fmt: skip
_SYSTEMS = ("You are a helpful assistant.", "Answer briefly.", "You are a careful tutor.")


def _turn(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randrange(10), rng.randrange(10)
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}."
    word = rng.choice(_WORDS)
    if kind == 1:
        return f"Reverse the word {word}.", f"{word[::-1]}"
    if kind == 2:
        return f"Spell {word}.", "-".join(word.upper())
    if kind == 3:
        country, city = rng.choice(_CAPITALS)
        return f"What is the capital of {country}?", f"The capital of {country} is {city}."
    letter = rng.choice(word)
    count = word.count(letter)
    return f"How many {letter} in {word}?", f"{count} {letter} in {word}."


def conversations(count: int = CONVERSATIONS, seed: int = 0) -> list[dict[str, Any]]:
    """The generated records (OpenAI-style ``messages``), the same on every machine."""
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        messages: list[dict[str, str]] = []
        if rng.random() < 0.3:
            messages.append({"role": "system", "content": rng.choice(_SYSTEMS)})
        for _ in range(1 + (rng.random() < 0.3)):
            question, answer = _turn(rng)
            messages += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer},
            ]
        records.append({"messages": messages})
    return records


def write_tokenizer(folder: Path) -> Path:
    """tokenizer.json (bytes + the specials) and tokenizer_config.json (ChatML) in `folder`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # ByteLevel's alphabet maps each byte to one printable character; ids in byte order, so a token
    # id is the byte's value, as the byte tokenizer's.
    byte_chars = sorted(alphabet, key=_byte_of)
    vocab = {char: i for i, char in enumerate(byte_chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return path


def _byte_of(char: str) -> int:
    """The byte a ByteLevel alphabet character stands for (GPT-2's bytes_to_unicode)."""
    code = ord(char)
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


def prepared_builtin(
    cache_root: Path,
    name: str,
    file_name: str,
    records: list[dict[str, Any]],
    input_format: str,
    source: dict[str, Any],
    timeout_s: float,
) -> Path:
    """A built-in set of `records` (`input_format`: chat or preference; written to `file_name`)
    prepared once under `cache_root`/`name` with the byte + ChatML tokenizer, under a file lock."""
    from launcher.data.builtin_corpus import prepared_once
    from launcher.data.prepare import prepare

    def make(target: Path) -> None:
        folder = Path(cache_root) / f"{name}.source"
        folder.mkdir(exist_ok=True)
        file = folder / file_name
        file.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        tokenizer = write_tokenizer(folder / "tokenizer")
        prepare(
            [file],
            target,
            tokenizer=str(tokenizer),
            overwrite=True,
            source=source,
            valid_fraction=0.05,
            fmt="megatron",
            input_format=input_format,
        )

    return prepared_once(cache_root, name, make, timeout_s)


def builtin_chat_dir(cache_root: Path, timeout_s: float = 600.0) -> Path:
    """The prepared built-in chat dataset under `cache_root` (made once, under a file lock)."""
    source = {"kind": "builtin-chat", "conversations": CONVERSATIONS}
    records = conversations()
    return prepared_builtin(
        cache_root, BUILTIN_CHAT, "conversations.jsonl", records, "chat", source, timeout_s
    )
