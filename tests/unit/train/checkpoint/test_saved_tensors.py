"""``saved_tensors``: tensors of torch.save files read by offset. What a tampered or inconsistent
file declares is checked against the file's own zip records before a byte is read as a value."""

from __future__ import annotations

import os
import zipfile
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from launcher.train.checkpoint.engine_dirs import ConsolidateError
from launcher.train.checkpoint.safe_load import CheckedFile, UnsafeCheckpointError
from launcher.train.checkpoint.saved_tensors import layout, where_stored

pytestmark = pytest.mark.unit


def _checked(path: Path) -> CheckedFile:
    return CheckedFile(os.open(path, os.O_RDONLY), path)


def _edit_pickle(src: Path, dst: Path, edit: dict[int, int]) -> None:
    """`src` copied to `dst` byte for byte but for bytes of its pickle ({position in the pickle:
    new byte}) and the pickle's CRC-32 (in its local header and the central directory)."""
    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/data.pkl"))
        pickle = bytearray(archive.read(info))
    start = data.index(bytes(pickle))
    old_crc = zlib.crc32(pickle).to_bytes(4, "little")
    for at, value in edit.items():
        data[start + at] = value
        pickle[at] = value
    new_crc = zlib.crc32(pickle).to_bytes(4, "little")
    assert data.count(old_crc) == 2
    dst.write_bytes(bytes(data).replace(old_crc, new_crc))


def test_a_storage_declared_larger_than_its_record_is_refused(tmp_path: Path) -> None:
    """torch.load refuses a pickle whose storage is longer than its record ("record size ...
    does not match"); read by offset, the bytes after the record (the zip's own headers) were
    served as the tensor's values. Seen failing before the records were checked."""
    source = tmp_path / "a.pt"
    torch.save({"a": torch.arange(4, dtype=torch.float32), "b": torch.full((4,), 7.0)}, source)
    with zipfile.ZipFile(source) as archive:
        pickle = archive.read("a/data.pkl")
    # 'a': ('storage', FloatStorage, '0', 'cpu', 4) then its size (4,): both BININT1 4 -> 40
    storage_numel = pickle.index(b"X\x03\x00\x00\x00cpuq\x06K\x04") + 11
    size = pickle.index(b"QK\x00K\x04", storage_numel) + 4
    tampered = tmp_path / "b.pt"
    _edit_pickle(source, tampered, {storage_numel: 40, size: 40})
    with pytest.raises(Exception, match="record size"):  # what torch itself says
        torch.load(tampered, weights_only=True)
    with _checked(tampered) as stream:
        saved = layout(stream, tampered)
        assert tuple(saved["a"].shape) == (40,)
        with pytest.raises(ConsolidateError, match="not where a record of its file lies"):
            where_stored(saved["a"], stream, "a")
        # torch places 'b' by the sizes declared before it (serialization._get_offset): that
        # offset is no record's either
        with pytest.raises(ConsolidateError, match="not where a record of its file lies"):
            where_stored(saved["b"], stream, "b")
    with _checked(source) as stream:  # the file as torch wrote it reads as saved
        saved = layout(stream, source)
        for name, want in {"a": torch.arange(4.0), "b": torch.full((4,), 7.0)}.items():
            out = torch.empty(4)
            where_stored(saved[name], stream, name).read(out, 0)
            assert torch.equal(out, want)


def test_a_dcp_item_larger_than_its_saved_chunk_is_refused(tmp_path: Path) -> None:
    """A DCP read item whose box lies outside the chunk saved for it (metadata and data that
    disagree) is refused; before, the runs past the chunk's end were read from whatever bytes
    followed it. DCP's own reader refuses it too (``narrow_tensor_by_index``). Seen failing."""
    from torch.distributed.checkpoint.planner import LoadItemType

    from launcher.train.checkpoint.consolidate import _read_item

    path = tmp_path / "chunk.distcp"
    torch.save(torch.arange(8, dtype=torch.float32).reshape(2, 4), path)
    target = torch.zeros(4, 4)
    item = SimpleNamespace(
        type=LoadItemType.TENSOR,
        storage_index=SimpleNamespace(fqn="model.w"),
        storage_offsets=torch.Size((0, 0)),
        lengths=torch.Size((4, 4)),  # the metadata says 4 rows; the chunk holds 2
    )
    info = SimpleNamespace(offset=0, length=path.stat().st_size, transform_descriptors=None)
    planner = SimpleNamespace(resolve_tensor=lambda _: target, commit_tensor=lambda *_: None)
    with _checked(path) as stream, pytest.raises(UnsafeCheckpointError, match=r"model\.w"):
        _read_item(info, item, stream, planner)
    ok = SimpleNamespace(**{**vars(item), "lengths": torch.Size((2, 3))})
    target = torch.zeros(2, 3)
    with _checked(path) as stream:
        _read_item(info, ok, stream, planner)
    assert torch.equal(target, torch.arange(8.0).reshape(2, 4)[:, :3])


def test_a_window_never_reads_before_its_start(tmp_path: Path) -> None:
    """A DCP item's window is a file of its own: a seek before its start fails as a file's
    does (zipfile, looking for a zip's end record in a window shorter than one, then finds
    no zip); before, the bytes ahead of the window were read as the window's. Seen failing."""
    from launcher.train.checkpoint.saved_tensors import Window

    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(100)))
    with _checked(path) as stream:
        window = Window(stream, 50, 10)
        assert window.seek(-4, os.SEEK_END) == 6 and window.read() == bytes(range(56, 60))
        with pytest.raises(OSError, match="before the start"):
            window.seek(-22, os.SEEK_END)
        assert window.tell() == 10  # where the read left it
        with pytest.raises(zipfile.BadZipFile):
            zipfile.ZipFile(window)


def test_a_strided_view_reads_back_and_one_past_its_storage_is_refused(tmp_path: Path) -> None:
    """A view saved with its base's strides (torch.save keeps the whole storage): its values are
    read from the span it covers. Here the view of a 3 x 4 base's last 2 rows and 3 columns,
    transposed: shape (3, 2), stride (1, 4), storage offset 5, so it spans
    1 + 2 * 1 + 1 * 4 = 7 elements, 5..11, the storage's last. The same pickle with the offset 6
    would reach element 12, one past the 12 stored: refused before a byte is read (torch's meta
    load sizes the storage to reach it, 52 bytes, which no 48-byte record of the file holds)."""
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = base[1:, 1:].t()
    assert (tuple(view.shape), view.stride(), view.storage_offset()) == ((3, 2), (1, 4), 5)
    source = tmp_path / "view.pt"
    torch.save({"v": view}, source)
    with _checked(source) as stream:
        stored = where_stored(layout(stream, source)["v"], stream, "v")
        out = torch.empty(6)
        stored.read(out, 0)
        assert torch.equal(out, view.reshape(-1))
        part = torch.empty(3)
        stored.read(part, 2)
        assert torch.equal(part, view.reshape(-1)[2:5])
    with zipfile.ZipFile(source) as archive:
        pickle = next(archive.read(n) for n in archive.namelist() if n.endswith("/data.pkl"))
    offset = pickle.index(b"QK\x05K\x03K\x02") + 2  # BINPERSID, then BININT1 5 (the offset)
    shifted = tmp_path / "shifted.pt"
    _edit_pickle(source, shifted, {offset: 6})
    with _checked(shifted) as stream:
        saved = layout(stream, shifted)["v"]
        assert saved.storage_offset() == 6
        with pytest.raises(ConsolidateError, match="not where a record of its file lies"):
            where_stored(saved, stream, "v")
