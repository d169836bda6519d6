"""Megatron-LM indexed dataset files: byte layout checked by hand against its documentation."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from launcher.data.megatron_indexed import IndexedDataset, IndexedDatasetWriter, optimal_dtype

pytestmark = pytest.mark.unit


def _write(prefix: Path, documents: list[list[int]], vocab: int) -> None:
    writer = IndexedDatasetWriter(prefix, vocab)
    for doc in documents:
        writer.add_document(doc)
    writer.finish()


def test_idx_bytes_match_the_documented_layout(tmp_path: Path) -> None:
    prefix = tmp_path / "corpus_text_document"
    _write(prefix, [[5, 6, 7], [1], [300, 301]], vocab=50_000)
    idx = (tmp_path / "corpus_text_document.idx").read_bytes()
    # Header: 9-byte magic, uint64 version 1, uint8 dtype code 8 (uint16 for a 50k vocabulary),
    # uint64 3 sequences, uint64 4 document indices (3 documents + the leading 0).
    assert idx[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack("<Q", idx[9:17]) == (1,)
    assert idx[17] == 8
    assert struct.unpack("<QQ", idx[18:34]) == (3, 4)
    # int32 lengths 3, 1, 2; int64 byte pointers 0, 6, 8 (2 bytes a token); int64 docs 0..3.
    assert struct.unpack("<3i", idx[34:46]) == (3, 1, 2)
    assert struct.unpack("<3q", idx[46:70]) == (0, 6, 8)
    assert struct.unpack("<4q", idx[70:102]) == (0, 1, 2, 3)
    assert len(idx) == 102
    data = (tmp_path / "corpus_text_document.bin").read_bytes()
    assert data == struct.pack("<6H", 5, 6, 7, 1, 300, 301)


def test_round_trip_and_int32_for_large_vocabularies(tmp_path: Path) -> None:
    assert optimal_dtype(65_499) is np.uint16
    assert optimal_dtype(128_256) is np.int32
    prefix = tmp_path / "big"
    docs = [[128_000, 3, 4], [], [99_999]]
    _write(prefix, docs, vocab=128_256)
    ds = IndexedDataset.open(prefix)
    assert ds.dtype == np.int32 and len(ds) == 3 and ds.num_tokens == 4
    assert [ds.sequence(i).tolist() for i in range(3)] == docs
    assert ds.document_indices.tolist() == [0, 1, 2, 3]


def test_token_out_of_range_is_refused(tmp_path: Path) -> None:
    writer = IndexedDatasetWriter(tmp_path / "x", vocab_size=1000)
    with pytest.raises(ValueError, match="out of range"):
        writer.add_document([70_000])


@pytest.mark.parametrize(
    "damage",
    ["magic", "truncated_idx", "short_bin"],
)
def test_damaged_files_are_refused(tmp_path: Path, damage: str) -> None:
    prefix = tmp_path / "d"
    _write(prefix, [[1, 2, 3, 4]], vocab=100)
    idx, binf = prefix.with_suffix(".idx"), prefix.with_suffix(".bin")
    if damage == "magic":
        idx.write_bytes(b"XXXXXXXXX" + idx.read_bytes()[9:])
    elif damage == "truncated_idx":
        idx.write_bytes(idx.read_bytes()[:40])
    else:
        binf.write_bytes(binf.read_bytes()[:4])
    with pytest.raises(ValueError):
        IndexedDataset.open(prefix)
