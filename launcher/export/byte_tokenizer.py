"""llmtrain's byte tokenizer (token id = UTF-8 byte value, ids 0-255) as a Hugging Face
``tokenizer.json``, so that an exported model loads with its tokenizer anywhere. The special tokens
the run's data used follow the bytes, in order from id 256: ``<|endoftext|>`` where `llmtrain data
prepare` ended each document with 256, the ChatML markers of the built-in chat data (257, 258).

Written with the ``tokenizers`` library's byte-level pieces: the ByteLevel pre-tokenizer (without
its word-splitting regex and without a prefix space) maps each byte to one printable character
(GPT-2's byte-to-unicode table, Radford et al. 2019: printable Latin-1 bytes map to themselves,
the other 68 to U+0100 onwards, in byte order), a BPE model with no merges maps each such
character to the id of its byte, and the ByteLevel decoder maps back. Encoding any text gives
exactly its UTF-8 bytes (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def byte_to_char() -> dict[int, str]:
    """GPT-2's byte-level alphabet: byte value -> the character standing for it."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), ord("\xff") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_byte_tokenizer(path: Path, specials: Sequence[str] = ()) -> None:
    """The byte tokenizer as tokenizer.json at `path`; `specials` get ids 256, 257, ... in order
    (special tokens: matched whole in text before the bytes, skipped by skip_special_tokens)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: b for b, char in byte_to_char().items()}
    assert set(vocab) == set(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    ids = [tokenizer.token_to_id(s) for s in specials]
    if ids != list(range(256, 256 + len(specials))):
        raise ValueError(f"byte tokenizer specials {list(specials)} are not distinct new tokens")
    tokenizer.save(str(path))
