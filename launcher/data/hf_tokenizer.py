"""A user's own Hugging Face ``tokenizer.json``, as llmtrain's data preparation uses it.

Loaded with the ``tokenizers`` library (no ``transformers``, nothing downloaded). The
end-of-document token appended after every document is ``eod_token`` when given, else the first of
``EOD_CANDIDATES`` the vocabulary holds (GPT-2 / Llama 3 / Llama 2 / Gemma conventions); a
tokenizer with none of them needs ``--eod-token``. ``encode_batch`` runs the library's own thread
pool, so a batch of documents uses every core. The file is read through the bounded reader (a
FIFO or folder in its place is refused as such, never waited on; at most ``MAX_FILE_BYTES``),
and what the library says about a malformed one is quoted through ``launcher.excerpt``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from launcher import bounded_read
from launcher.errors import UserError
from launcher.excerpt import message as quoted

# Real tokenizer.json files are 2-40 MB (Llama 3: 9 MB, Gemma 3: 33 MB).
MAX_FILE_BYTES = 512 << 20
EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")


def read_tokenizer_json(path: Path, what: str) -> str:
    """The text of a tokenizer.json, read bounded; UserError starting with `what` when it is
    missing, not a regular file (a FIFO is refused, never waited on), too large or not UTF-8."""
    try:
        return bounded_read.read_regular(path, MAX_FILE_BYTES, follow_symlinks=True).decode()
    except FileNotFoundError:
        raise UserError(f"{what}: no such file (a Hugging Face tokenizer.json)") from None
    except bounded_read.FileRefused as exc:
        raise UserError(f"{what}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{what}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"{what}: cannot read it ({exc.strerror})") from None


class HFTokenizerFile:
    """tokenizer.json: vocabulary size (added tokens included), EOD id, batch encoding."""

    name = "hf"

    def __init__(self, path: Path, eod_token: str | None = None):
        # Rust-side threads; the library turns them off after a fork unless told otherwise.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
        from tokenizers import Tokenizer

        self.path = Path(path)
        text = read_tokenizer_json(self.path, f"--tokenizer {path}")
        try:
            self._tok: Any = Tokenizer.from_str(text)
        except Exception as exc:  # the library raises a bare Exception on a malformed file
            raise UserError(
                f"--tokenizer {path}: not a tokenizer.json the library reads ({quoted(str(exc))})"
            ) from None
        # The tokenizer_config.json settings that change ids, as transformers applies them.
        from launcher.data.tokenizer_settings import CONFIG_FILE, apply_settings

        apply_settings(self._tok, self.path.parent / CONFIG_FILE)
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.eod_id: int | None = self._find_eod(eod_token)

    def _find_eod(self, eod_token: str | None) -> int:
        candidates = (eod_token,) if eod_token else EOD_CANDIDATES
        for token in candidates:
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                return int(token_id)
        if eod_token:
            raise UserError(f"--eod-token {eod_token!r}: not in {self.path}'s vocabulary")
        raise UserError(
            f"{self.path}: none of {', '.join(EOD_CANDIDATES)} is in the vocabulary; "
            "name the end-of-document token with --eod-token TOKEN"
        )

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text (no special tokens added; the caller appends the EOD)."""
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))

    def save(self, path: Path) -> None:
        self._tok.save(str(path))
