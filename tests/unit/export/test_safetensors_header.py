"""A safetensors header that lies (issue 42, item 3): `validate` and `run` with train.init_from
on such a Hugging Face folder exit 2 naming the file and the problem, before the library (which
trusts the header) or torch sees it; every rule of ``launcher.export.safetensors_header``."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from launcher.export.safetensors_header import HeaderError, parse_header, read_header
from tests.cli import invoke, said

pytestmark = pytest.mark.unit
MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.ffn_hidden_size=128"]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export of the MODEL shape (config.json + model.safetensors), made once."""
    from launcher.config.composition.compose import compose_config
    from launcher.export.hf_files import write_hf_folder
    from launcher.export.hf_layout import hf_config, to_hf
    from launcher.train.model.transformer import build_model

    m = compose_config(MODEL).config.model
    out = tmp_path_factory.mktemp("hf") / "model"
    write_hf_folder(out, to_hf(build_model(m, "cpu").state_dict(), m), hf_config(m))
    return out


def split(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def join(header: dict[str, Any], body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def lie(folder: Path, kind: str, to: Path) -> Path:
    """A copy of `folder` whose model.safetensors header lies in the way `kind` says."""
    shutil.copytree(folder, to)
    file = to / "model.safetensors"
    header, body = split(file)
    first = sorted(k for k in header if k != "__metadata__")[0]
    if kind == "length":
        file.write_bytes(struct.pack("<Q", 2**60) + file.read_bytes()[8:])
        return to
    if kind == "offsets":
        header[first]["data_offsets"] = [0, 10**12]
    elif kind == "shape":
        header[first]["shape"] = [100000, 100000]
    elif kind == "dtype":
        header[first]["dtype"] = "F4"
    file.write_bytes(join(header, body))
    return to


LIES = ["length", "offsets", "shape", "dtype"]


@pytest.mark.parametrize("kind", LIES)
def test_validate_and_run_refuse_a_lying_header(
    kind: str, hf_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = lie(hf_folder, kind, tmp_path / "hf")
    # validate notes what `run` would refuse (exit 0); run refuses it (exit 2), before any write.
    for command, want in (("validate", 0), ("run", 2)):
        code, output = said(
            invoke(command, *MODEL, f"train.init_from={folder}", cwd=tmp_path, timeout=60)
        )
        assert code == want, (command, output[-3000:])
        assert "Traceback" not in output and "model.safetensors" in output, output[-3000:]
        assert "train.init_from" in output and "refuse" in output, output
    assert not (tmp_path / "runs").exists()


def test_the_untouched_export_reads_back(hf_folder: Path) -> None:
    entries = read_header(hf_folder / "model.safetensors")
    assert entries and all(e.dtype == "F32" for e in entries.values())
    code, output = said(invoke("validate", *MODEL, f"train.init_from={hf_folder}"))
    assert code == 0, output


def _one(dtype: str = "F32", shape: object = (2, 3), offsets: object = (0, 24)) -> dict[str, Any]:
    shape = list(shape) if isinstance(shape, tuple) else shape
    offsets = list(offsets) if isinstance(offsets, tuple) else offsets
    return {"w": {"dtype": dtype, "shape": shape, "data_offsets": offsets}}


@pytest.mark.parametrize(
    ("header", "size", "words"),
    [
        (_one(), 24, None),
        (_one(shape=[]), 4, "needs 4 bytes"),  # a scalar, offsets spanning 24
        (_one(shape=[], offsets=(0, 4)), 4, None),
        (_one(offsets=(0, 24)), 23, "buffer"),  # past the end of the file
        (_one(offsets=(0, 24)), 30, "end at byte 24"),  # bytes left over
        (_one(offsets=(24, 0)), 24, "data_offsets span"),
        (_one(shape=[100000, 100000]), 24, "needs 40,000,000,000"),
        (_one(shape=[-1, 3]), 24, "whole numbers"),
        (_one(shape=[True, 3]), 24, "whole numbers"),
        (_one(shape=[1] * 33, offsets=(0, 4)), 4, "at most 32"),
        (_one(dtype="F4"), 24, "dtype 'F4'"),
        (_one(offsets=[0]), 24, "[BEGIN, END]"),
        ({"w": {"dtype": "F32", "shape": [1]}}, 4, "dtype, shape and data_offsets"),
        ({"__metadata__": {"a": 1}}, 0, "strings to strings"),
        ([1, 2], 0, "not a JSON object"),
        (  # two tensors over the same bytes
            {**_one(), "v": {"dtype": "F32", "shape": [6], "data_offsets": [0, 24]}},
            48,
            "do not follow",
        ),
    ],
)
def test_header_rules(header: object, size: int, words: str | None) -> None:
    if words is None:
        assert set(parse_header(header, size, "f")) == {"w"}
        return
    with pytest.raises(HeaderError) as info:
        parse_header(header, size, "f")
    assert words in str(info.value), info.value


def test_read_header_refuses_files_that_are_not_safetensors(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x00")
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.safetensors"
    zero.symlink_to("/dev/zero")
    not_json = tmp_path / "text.safetensors"
    not_json.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{}")
    for path, words in [
        (short, "too short"),
        (fifo, "FIFO"),
        (zero, "character device"),
        (not_json, "UTF-8"),
        (tmp_path / "absent", "cannot be read"),
    ]:
        with pytest.raises(HeaderError, match=words):
            read_header(path)
