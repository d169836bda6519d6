"""Byte-level `data prepare` ends every document with an id of its own (issue 33, item 8), so
documents no longer run together; data prepared before it (no end-of-document id, vocabulary
256) reads as it did, and a model on the new data gets its 257 ids without being told."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from launcher.config.composition.compose import compose_config
from launcher.data.prepare import prepare
from launcher.data.token_index import PreparedIndex
from launcher.data.tokenizer import load_tokenizer
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit


def tokens(folder: Path) -> np.ndarray:
    index = PreparedIndex.load(folder)
    return np.concatenate(
        [np.fromfile(folder / s.file, dtype=np.dtype(index.dtype).newbyteorder("<"))
         for s in index.shards]
    )  # fmt: skip


def test_data_prepare_ends_each_byte_document_with_id_256(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("first")
    (tmp_path / "in" / "b.txt").write_text("second")
    out = tmp_path / "data"
    result = invoke(
        "data", "prepare", "--input", str(tmp_path / "in"), "--output", str(out),
        "--format", "shards", "--valid-fraction", "0", "--json",
    )  # fmt: skip
    assert result.returncode == 0, shown(result)
    doc = json.loads(result.stdout)
    assert (doc["tokenizer"], doc["eod_id"], doc["vocab_size"]) == ("byte", 256, 257)
    ids = tokens(out).tolist()
    assert ids == [*b"first", 256, *b"second", 256]
    assert load_tokenizer(out).decode(ids) == "firstsecond"
    # a model trained on it embeds the 257 ids, unless the user says otherwise
    assert compose_config([f"data.path={out}"]).config.model.vocab_size == 257
    blend = compose_config([f"data.blend=[1.0,{out}]"]).config.model
    assert blend.vocab_size == 257


def test_byte_data_prepared_before_reads_as_it_did(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("first")
    out = tmp_path / "old"
    prepare([tmp_path / "a.txt"], out, tokenizer="byte")  # no end-of-document id, as before
    index = PreparedIndex.load(out)
    assert (index.eod_id, index.vocab_size, index.dtype) == (None, 256, "uint8")
    assert tokens(out).tolist() == list(b"first")
    assert load_tokenizer(out).decode(tokens(out)) == "first"
    assert compose_config([f"data.path={out}"]).config.model.vocab_size == 256
