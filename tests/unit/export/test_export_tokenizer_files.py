"""The tokenizer `llmtrain export` writes for each kind of prepared data, without a training run:
byte data with and without the end-of-document id, a tokenizer.json folder with its
tokenizer_config.json (named eos, chat template), and hostile or absent config files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.export.byte_tokenizer import write_byte_tokenizer
from launcher.train.checkpoint.hf_export import (
    TokenizerFiles,
    generation_ids,
    special_ids,
    special_tokens,
    tokenizer_extras,
    tokenizer_files,
)

pytestmark = pytest.mark.unit

NONE = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def _data(folder: Path, index: dict[str, object]) -> Path:
    folder.mkdir()
    (folder / "index.json").write_text(json.dumps(index))
    return folder


def _export_of(folder: Path, vocab: int) -> tuple[TokenizerFiles, dict[str, int | None]]:
    cfg = compose_config([f"data.path={folder}", f"model.vocab_size={vocab}"]).config
    tok = tokenizer_files(cfg)
    return tok, special_ids(tok.eod_id, vocab, special_tokens(tok.files, tok.eod_id))


def test_older_byte_data_exports_the_plain_byte_tokenizer(tmp_path: Path) -> None:
    write_byte_tokenizer(tmp_path / "plain.json")
    folder = _data(tmp_path / "old", {"tokenizer": "byte", "vocab_size": 256})
    tok, ids = _export_of(folder, 256)
    assert tok.files["tokenizer.json"] == (tmp_path / "plain.json").read_bytes()
    assert tok.eod_id is None and ids == NONE
    config = json.loads(tokenizer_extras(tok.files, None, 8)["tokenizer_config.json"])
    assert "eos_token" not in config
    # An index naming another id than 256 for byte data is read as none (as training reads it).
    tok, ids = _export_of(_data(tmp_path / "odd", {"tokenizer": "byte", "eod_id": 7}), 256)
    assert tok.eod_id is None and ids == NONE


def test_byte_data_with_eod_names_id_256_everywhere(tmp_path: Path) -> None:
    folder = _data(tmp_path / "new", {"tokenizer": "byte", "vocab_size": 257, "eod_id": 256})
    tok, ids = _export_of(folder, 257)
    added = json.loads(tok.files["tokenizer.json"])["added_tokens"]
    assert [(t["id"], t["content"], t["special"]) for t in added] == [(256, "<|endoftext|>", True)]
    assert ids == {"bos_token_id": 256, "eos_token_id": 256, "pad_token_id": 256}
    # A model whose vocabulary stops at 256 has no such token: nothing named.
    assert special_ids(256, 256, special_tokens(tok.files, 256)) == NONE


def test_a_tokenizer_json_folder_carries_its_turn_end_and_template(tmp_path: Path) -> None:
    folder = _data(
        tmp_path / "chat", {"tokenizer": "hf", "eod_id": 256, "tokenizer_file": "tokenizer.json"}
    )
    write_byte_tokenizer(folder / "tokenizer.json", ["<|endoftext|>", "<|eot|>"])
    template = "{% for m in messages %}{{ m['content'] }}<|eot|>{% endfor %}"
    config = {"eos_token": {"content": "<|eot|>", "special": True}, "chat_template": template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    cfg = compose_config([f"data.path={folder}", "model.vocab_size=258"]).config
    tok = tokenizer_files(cfg)
    tokens = special_tokens(tok.files, tok.eod_id, tok.data_config)
    assert tokens == {
        "bos": ("<|endoftext|>", 256),
        "eos": ("<|eot|>", 257),
        "pad": ("<|endoftext|>", 256),
    }
    assert generation_ids(tok.eod_id, 258, tokens)["eos_token_id"] == [257, 256]
    written = json.loads(
        tokenizer_extras(tok.files, 256, 8, tok.data_config)["tokenizer_config.json"]
    )
    assert written["eos_token"] == "<|eot|>" and written["chat_template"] == template
    # A tokenizer_config.json that is a link is not read (nor one that is no JSON object).
    (folder / "tokenizer_config.json").unlink()
    (folder / "tokenizer_config.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps(config))
    assert tokenizer_files(cfg).data_config == {}
    # An eos the tokenizer does not hold is not named: the end-of-document token stays eos.
    tokens = special_tokens(tok.files, 256, {"eos_token": "<|missing|>"})
    assert tokens["eos"] == ("<|endoftext|>", 256)
