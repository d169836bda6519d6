"""`llmtrain sample` on fine-tuning data: the prompt becomes one user turn of the data's chat
template with its generation prompt, and the template's end-of-turn token ends the reply."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.data.chat.builtin_chat import SPECIALS, write_tokenizer
from launcher.data.tokenizer import ByteTokenizer
from launcher.train.sample import chat_template, prompt_ids

pytestmark = pytest.mark.unit


class _Bytes(ByteTokenizer):
    """Bytes plus the built-in chat data's specials (ids 256-258), as its tokenizer.json has."""

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        while text:
            special = next((s for s in SPECIALS if text.startswith(s)), None)
            if special is not None:
                ids.append(256 + SPECIALS.index(special))
                text = text[len(special) :]
            else:
                ids.extend(text[0].encode())
                text = text[1:]
        return ids


def test_a_prompt_is_a_user_turn_and_the_turn_end_stops(tmp_path: Path) -> None:
    write_tokenizer(tmp_path)
    template = chat_template(tmp_path)
    assert template is not None
    tok = _Bytes()
    ids, stop = prompt_ids(tok, template, "hi")
    # ChatML: "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" (generation prompt).
    expected = [257, *b"user\nhi", 258, *b"\n", 257, *b"assistant\n"]
    assert ids == expected
    assert 258 in stop  # <|im_end|>, the template's eos_token


def test_without_a_template_the_text_is_continued(tmp_path: Path) -> None:
    assert chat_template(tmp_path) is None  # no tokenizer_config.json
    ids, stop = prompt_ids(ByteTokenizer(), None, "hi")
    assert ids == list(b"hi") and stop == set()
