"""Safetensors written tensor by tensor are the files the library writes (the data, the offsets,
the header's length and content; only ``__metadata__``'s key order, random in the library, may
differ), and the maker is asked for each tensor once, as its bytes are written."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from launcher.export.hf_files import INDEX_FILE, read_hf_folder, write_hf_folder
from launcher.export.safetensors_stream import Spec, Streamed, write_file

pytestmark = pytest.mark.unit


def _split(data: bytes) -> tuple[bytes, dict[str, object], bytes]:
    (size,) = struct.unpack("<Q", data[:8])
    return data[:8], json.loads(data[8 : 8 + size]), data[8 + size :]


def test_a_streamed_file_is_the_librarys_file(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(5, 3, generator=g),
        "a.bf16": torch.randn(4, generator=g).bfloat16(),
        "ids": torch.arange(7),
        "mask": torch.tensor([True, False, True]),
        "half": torch.randn(2, 2, generator=g).half(),
        "f64": torch.randn(3, generator=g, dtype=torch.float64),
        "scalar": torch.tensor(1.5),
        "empty": torch.zeros(0, 4),
        "t": torch.randn(3, 6, generator=g).T,  # not contiguous
        "u8": torch.arange(9, dtype=torch.uint8),
    }
    metadata = {"format": "pt", "llmtrain_run": "r", "llmtrain_step": "3"}
    asked: list[str] = []

    def make(name: str) -> torch.Tensor:
        asked.append(name)
        return tensors[name]

    path = tmp_path / "x.safetensors"
    write_file(path, Streamed.of(tensors).specs, make, metadata)
    library = save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)
    ref_len, ref_header, ref_data = _split(library)
    mine_len, mine_header, mine_data = _split(path.read_bytes())
    assert (mine_len, mine_header, mine_data) == (ref_len, ref_header, ref_data)
    assert sorted(asked) == sorted(tensors)  # each made once


def test_a_tensor_made_other_than_announced_is_refused(tmp_path: Path) -> None:
    spec = Spec("w", torch.float32, (2, 2))
    with pytest.raises(ValueError, match="announced as"):
        write_file(tmp_path / "x.safetensors", [spec], lambda _: torch.zeros(2, 3))


def test_streamed_shards_match_the_tensors_in_memory(tmp_path: Path) -> None:
    tensors = {f"layer.{i}.w": torch.full((64,), float(i)) for i in range(10)}
    made: list[str] = []
    stream = Streamed.of(tensors)
    lazy = Streamed(stream.specs, lambda n: made.append(n) or tensors[n])
    write_hf_folder(tmp_path / "a", lazy, {"x": 1}, max_shard_bytes=3 * 256)
    write_hf_folder(tmp_path / "b", tensors, {"x": 1}, max_shard_bytes=3 * 256)
    index = json.loads((tmp_path / "a" / INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) == 4 and len(made) == 10
    for name in sorted(p.name for p in (tmp_path / "b").iterdir()):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    back, _ = read_hf_folder(tmp_path / "a")
    assert all(torch.equal(back[k], v) for k, v in tensors.items())
