"""Pieces of export / init_from that need no training run: the byte tokenizer as tokenizer.json,
the shape check's messages, an older run's config.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launcher.config.composition.compose import compose_config
from launcher.export.byte_tokenizer import byte_to_char, write_byte_tokenizer
from launcher.train.checkpoint.hf_export import run_config
from launcher.train.checkpoint.init_from import mismatches

pytestmark = pytest.mark.unit


def test_byte_tokenizer_json_encodes_utf8_bytes(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    write_byte_tokenizer(tmp_path / "tokenizer.json")
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "héllo wörld\n\t 日本 \x00 end"
    ids = tok.encode(text).ids
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.get_vocab_size() == 256 and len(set(byte_to_char().values())) == 256


def test_shape_mismatches_name_the_key_and_both_shapes() -> None:
    want = {"a.weight": (4, 2), "b.weight": (3,)}
    assert mismatches(dict(want), want) == []
    found = mismatches({"a.weight": (4, 3), "c": (1,)}, want)
    assert found == [
        "a.weight: weights [4, 3], model [4, 2]",
        "b.weight: missing from the weights (the model has [3])",
        "c: in the weights ([1]), not in the model",
    ]


def test_a_run_made_before_newer_keys_still_reads(tmp_path: Path) -> None:
    values = compose_config(["model.num_layers=3"]).values
    del values["logging"]
    del values["train"]["init_from"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(values))
    cfg = run_config(tmp_path)
    assert cfg.model.num_layers == 3 and cfg.train.init_from is None


def test_special_ids_are_written_even_when_absent() -> None:
    # Without explicit ids transformers' GPT-2 defaults (50256) would name an id outside a small
    # vocabulary; an end-of-document id outside the vocabulary is not a token either.
    from launcher.train.checkpoint.hf_export import special_ids

    none = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    assert special_ids(None, 256) == none
    assert special_ids(256, 256) == none
    assert special_ids(0, 300) == {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}


def test_tokenizer_config_names_the_end_of_document_token() -> None:
    import json

    from launcher.train.checkpoint.hf_export import tokenizer_extras

    tokenizer = {"added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True}]}
    files = {"tokenizer.json": json.dumps(tokenizer).encode()}
    extras = tokenizer_extras(files, 0, 1024)
    config = json.loads(extras["tokenizer_config.json"])
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["eos_token"] == config["bos_token"] == config["pad_token"] == "<|endoftext|>"
    assert config["model_max_length"] == 1024
    assert json.loads(extras["special_tokens_map.json"])["eos_token"] == "<|endoftext|>"
    assert "eos_token" not in json.loads(tokenizer_extras(files, None, 8)["tokenizer_config.json"])
    assert tokenizer_extras({}, 0, 8) == {}  # no tokenizer.json written: nothing to describe
