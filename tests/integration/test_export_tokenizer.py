"""`llmtrain export` writes the tokenizer the run's data really used, special ids included.

Through the CLI: byte data prepared by `llmtrain data prepare` (each document ended by id 256,
vocabulary 257) and the built-in chat data (data=chat: <|endoftext|> 256, <|im_start|> 257,
<|im_end|> 258) each train 2 steps of a tiny model and are exported; transformers (a dev
dependency) loads the folder and must decode the special ids, name them as eos/pad, encode them
back from text, and stop generation at them (generation_config.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import invoke, llmtrain
from tests.integration.test_data_eval import SMALL, generate_without_warnings, make_corpus
from tests.integration.test_run import only_run_dir

pytestmark = pytest.mark.integration

STEPS = ["train.steps=2", "train.log_every=1"]


def train_and_export(where: Path, *overrides: str) -> Path:
    done = llmtrain(
        "run", *SMALL, *STEPS, *overrides, cwd=where, env={"LLMTRAIN_CACHE": str(where)}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    exported = invoke("export", str(only_run_dir(where)), "--out", "hf", "--json", cwd=where)
    assert exported.returncode == 0, exported.stderr[-3000:]
    return where / "hf"


def test_byte_data_with_eod_exports_a_tokenizer_that_knows_it(tmp_path: Path) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    corpus, _ = make_corpus(tmp_path, 200)
    prepared = invoke(
        "data", "prepare", "--input", str(corpus), "--output", "data", "--json", cwd=tmp_path
    )
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    index = json.loads(prepared.stdout)
    assert index["tokenizer"] == "byte" and index["eod_id"] == 256 and index["vocab_size"] == 257
    hf = train_and_export(tmp_path, f"data.path={tmp_path / 'data'}", "model.vocab_size=257")

    tok = AutoTokenizer.from_pretrained(str(hf))
    assert len(tok) == 257
    assert tok.decode([256]) == "<|endoftext|>"
    assert tok.eos_token == tok.pad_token == "<|endoftext|>" and tok.eos_token_id == 256
    text = "héllo wörld\n"
    ids = tok(text + "<|endoftext|>")["input_ids"]
    assert ids == [
        *text.encode("utf-8"),
        256,
    ]  # the bytes, then the id the data ended documents with
    assert tok.decode(ids) == text + "<|endoftext|>"
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert GenerationConfig.from_pretrained(str(hf)).eos_token_id == 256
    config = json.loads((hf / "config.json").read_text())
    assert config["eos_token_id"] == config["pad_token_id"] == 256
    generate_without_warnings(hf)


def test_builtin_chat_data_exports_its_chatml_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    hf = train_and_export(tmp_path, "data=chat", "model.vocab_size=259")

    tok = AutoTokenizer.from_pretrained(str(hf))
    assert len(tok) == 259
    assert tok.decode([256, 257, 258]) == "<|endoftext|><|im_start|><|im_end|>"
    # A chat model's answer ends with its turn end; the document end stops generation too.
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 258 and tok.pad_token_id == 256
    assert GenerationConfig.from_pretrained(str(hf)).eos_token_id == [258, 256]
    chat = [{"role": "user", "content": "Spell cat."}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    text = "<|im_start|>user\nSpell cat.<|im_end|>\n<|im_start|>assistant\n"
    assert ids == tok(text)["input_ids"]
    assert ids[0] == 257 and ids[-13:] == [258, 10, 257, *b"assistant\n"]
    assert tok.decode(ids) == text
    generate_without_warnings(hf)
