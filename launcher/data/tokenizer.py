"""The tokenizers of prepared token data: UTF-8 bytes, a byte-level BPE trained here with the
`tokenizers` library (``<|endoftext|>``, id 0, ends each document), or the user's own
tokenizer.json (``launcher.data.hf_tokenizer``); and ``load_tokenizer``, the one a prepared folder
was made with. Nothing here imports torch or downloads anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from launcher import fsio
from launcher.data.hf_tokenizer import HFTokenizerFile
from launcher.data.token_index import PreparedIndex
from launcher.errors import UserError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
EOD_TOKEN = "<|endoftext|>"


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eod_id: int | None

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens (ids 0-255); with `eod`, id 256 ends each document (vocabulary 257)."""

    name = "byte"

    def __init__(self, eod: bool = False):
        self.eod_id: int | None = 256 if eod else None
        self.vocab_size = 257 if eod else 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        data = np.asarray(ids)
        data = data[(data >= 0) & (data < 256)]  # the end-of-document id is no byte
        return bytes(data.astype(np.uint8).tolist()).decode("utf-8", errors="replace")


class BPETokenizer:
    """Byte-level BPE (GPT-2 style) from the `tokenizers` library, trained locally."""

    name = "bpe"

    def __init__(self, tokenizer: Any):
        self._tok = tokenizer
        self.vocab_size: int = int(tokenizer.get_vocab_size())
        eod = tokenizer.token_to_id(EOD_TOKEN)
        self.eod_id: int | None = None if eod is None else int(eod)

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int, eod_token: str = EOD_TOKEN
    ) -> BPETokenizer:
        """Train a byte-level BPE on `texts` (end-of-document token `eod_token`, id 0). A corpus
        with fewer distinct pairs to merge than `vocab_size` asks for gives a smaller
        vocabulary: that is said on stderr (``vocab_shortfall``)."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        if vocab_size < 257 + 1:
            raise UserError(
                f"data.bpe_vocab_size={vocab_size}: a byte-level BPE needs at least 258 "
                "(256 bytes, the end-of-document token and one merge)"
            )
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[eod_token],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def from_file(cls, path: Path) -> BPETokenizer:
        """The BPE a prepared folder holds, read bounded (a FIFO there is refused)."""
        from tokenizers import Tokenizer as HFTokenizer

        from launcher.data.hf_tokenizer import read_tokenizer_json

        return cls(HFTokenizer.from_str(read_tokenizer_json(path, str(path))))

    def save(self, path: Path) -> None:
        self._tok.save(str(path))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text).ids, dtype=np.int64)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64) for e in self._tok.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return str(self._tok.decode([int(i) for i in ids]))


def vocab_shortfall(asked: int, got: int) -> str | None:
    """Why a trained BPE is smaller than asked (None when it is not)."""
    if got >= asked:
        return None
    return (
        f"--vocab-size={asked}: the BPE stopped at {got} tokens because the corpus has no more "
        "pairs of tokens to merge (too little or too repetitive text); give more text, or set "
        f"model.vocab_size={got} or more"
    )


def load_tokenizer(data_dir: Path) -> Tokenizer:
    """The tokenizer a prepared directory was made with."""
    index = PreparedIndex.load(data_dir)
    if index.tokenizer == "byte":
        return ByteTokenizer(eod=index.eod_id == 256)
    path = data_dir / (index.tokenizer_file or TOKENIZER_FILE)
    if index.tokenizer == "hf":
        return HFTokenizerFile(path)
    return BPETokenizer.from_file(path)


def token_dtype(vocab_size: int) -> str:
    """Smallest unsigned dtype holding every token id."""
    if vocab_size <= 2**8:
        return "uint8"
    if vocab_size <= 2**16:
        return "uint16"
    return "uint32"


def write_tokenizer_config(directory: Path, tok: Any) -> None:
    """tokenizer_config.json beside tokenizer.json, so that Hugging Face's
    ``AutoTokenizer.from_pretrained(DIR)`` (Megatron-LM's HuggingFaceTokenizer) loads the folder
    as a fast tokenizer with its end-of-document token, without a model config.json."""
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if tok.eod_id is not None:
        config["eos_token"] = str(tok._tok.id_to_token(tok.eod_id))
    fsio.write_json_atomic(directory / TOKENIZER_CONFIG_FILE, config)
