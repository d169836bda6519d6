"""Bring-your-own data: document readers, a user's tokenizer.json, Megatron-style blends."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from launcher.data.blend import BlendedTokens, blending_indices, parse_blend
from launcher.data.documents import iter_documents
from launcher.data.hf_tokenizer import HFTokenizerFile
from launcher.data.megatron_indexed import IndexedDatasetWriter
from launcher.errors import UserError

pytestmark = pytest.mark.unit


# --- documents -----------------------------------------------------------------------------------
def test_jsonl_json_and_text_documents_in_order(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"text": "first {doc}", "id": 1})
        + "\n\n"
        + json.dumps({"text": "second"})
        + "\n"
    )
    (tmp_path / "b.json").write_text(json.dumps({"rows": [{"body": "x"}, {"body": "y"}]}))
    (tmp_path / "c.txt").write_text("plain text")
    docs = list(iter_documents([tmp_path / "a.jsonl", tmp_path / "c.txt"]))
    # The JSON braces of the record are not part of the document.
    assert docs == ["first {doc}", "second", "plain text"]
    assert list(iter_documents([tmp_path / "b.json"], text_key="body")) == ["x", "y"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"text": "ok"}\n{"txt": "oops"}\n', r"a\.jsonl:2: no 'text' field \(it has: 'txt'\)"),
        ('{"text": "ok"}\n{not json\n', r"a\.jsonl:2: invalid JSON"),
        ('{"text": 3}\n', r"'text' is int"),
    ],
)
def test_bad_jsonl_names_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "a.jsonl").write_text(content)
    with pytest.raises(UserError, match=message):
        list(iter_documents([tmp_path / "a.jsonl"]))


def test_binary_input_is_refused_unless_allowed(tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(b"\x7fELF\x00\x01\x02")
    with pytest.raises(UserError, match=r"NUL bytes.*--allow-binary"):
        list(iter_documents([tmp_path / "blob.bin"]))
    (tmp_path / "latin.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        list(iter_documents([tmp_path / "latin.txt"]))
    assert list(iter_documents([tmp_path / "latin.txt"], allow_binary=True)) == ["caf\ufffd"]


def test_parquet_and_saved_dataset_folders(tmp_path: Path) -> None:
    import pyarrow as pa  # a dev dependency: this test runs in CI
    import pyarrow.parquet as pq

    table = pa.table({"text": ["p1", None, "p2"], "n": [1, 2, 3]})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=2)
    assert list(iter_documents([tmp_path / "d.parquet"])) == ["p1", "p2"]
    with pytest.raises(UserError, match="no 'content' column"):
        list(iter_documents([tmp_path / "d.parquet"], text_key="content"))

    # What datasets' save_to_disk writes: Arrow IPC stream files, state.json listing them.
    saved = tmp_path / "saved"
    saved.mkdir()
    arrow_file = str(saved / "data-00000-of-00001.arrow")
    with pa.OSFile(arrow_file, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    (saved / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    (saved / "dataset_info.json").write_text("{}")
    assert list(iter_documents([saved])) == ["p1", "p2"]


# --- tokenizer.json ------------------------------------------------------------------------------
def _word_level_tokenizer(path: Path, specials: list[str]) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "hello", "world", *specials])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def test_tokenizer_json_finds_the_eod_and_encodes_in_batches(tmp_path: Path) -> None:
    path = _word_level_tokenizer(tmp_path / "tokenizer.json", ["<|end_of_text|>"])
    tok = HFTokenizerFile(path)
    assert tok.vocab_size == 4 and tok.eod_id == 3  # Llama 3's end-of-text token
    ids = tok.encode_batch(["hello world", "world zzz"])
    assert [i.tolist() for i in ids] == [[1, 2], [2, 0]]


def test_tokenizer_without_an_eod_needs_one_named(tmp_path: Path) -> None:
    path = _word_level_tokenizer(tmp_path / "tokenizer.json", ["<sep>"])
    with pytest.raises(UserError, match="--eod-token"):
        HFTokenizerFile(path)
    assert HFTokenizerFile(path, eod_token="<sep>").eod_id == 3
    with pytest.raises(UserError, match="not in"):
        HFTokenizerFile(path, eod_token="<nope>")


# --- blends --------------------------------------------------------------------------------------
def test_parse_blend_normalises_and_names_bad_entries() -> None:
    entries = parse_blend([3, "a", 1, "b"])
    assert [e.weight for e in entries] == [0.75, 0.25]
    for bad in ([0.5], [0, "a"], ["a", 0.5], [True, "a"]):
        with pytest.raises(UserError, match=r"data\.blend"):
            parse_blend(bad)


def test_blending_follows_megatrons_rule() -> None:
    # Weights 0.75 / 0.25. i=0: errors 0.75 vs 0.25 -> a. i=1: 0.75-1, 0.25 -> b.
    # i=2: 1.5-1, 0.5-1 -> a. i=3: 2.25-2, 0.75-1 -> a. i=4: 3-3, 1-1 -> tie, first -> a.
    # i=5: 3.75-4, 1.25-1 -> b.
    dataset, ordinal = blending_indices([0.75, 0.25], 8)
    assert dataset.tolist() == [0, 1, 0, 0, 0, 1, 0, 0]
    assert ordinal.tolist() == [0, 0, 1, 2, 3, 1, 4, 5]
    many, _ = blending_indices([0.7, 0.2, 0.1], 1000)
    assert np.bincount(many).tolist() == [700, 200, 100]


def _dataset(prefix: Path, start: int, tokens: int, vocab: int = 1000) -> Path:
    writer = IndexedDatasetWriter(prefix, vocab)
    writer.add_document(np.arange(start, start + tokens))
    writer.finish()
    return prefix


def test_blended_windows_are_deterministic_and_wrap(tmp_path: Path) -> None:
    a = _dataset(tmp_path / "a", 0, 40)  # 10 windows of 4 tokens (seq_len 3)
    b = _dataset(tmp_path / "b", 500, 8)  # 2 windows: sampled half the time, so it wraps
    blend = parse_blend([1, str(a), 1, str(b)])
    first = BlendedTokens(blend, seq_len=3, seed=7)
    again = BlendedTokens(blend, seq_len=3, seed=7)
    assert first.num_sequences(3) == 12
    rows = first.batch(range(12), 3)
    assert np.array_equal(rows, again.batch(range(12), 3))
    from_b = rows[rows[:, 0] >= 500]
    assert len(from_b) == 6  # half the samples although b has 2 of 12 windows
    # Every window is 4 consecutive tokens of its dataset, starting at a window boundary.
    assert all((row == row[0] + np.arange(4)).all() and row[0] % 4 == 0 for row in rows)
    with pytest.raises(UserError, match="fewer than seq_length"):
        BlendedTokens(parse_blend([1, str(a), 1, str(_dataset(tmp_path / "c", 0, 3))]), 3, 7)
