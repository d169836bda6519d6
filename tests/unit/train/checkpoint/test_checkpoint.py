"""Checkpoints: atomic writes, pruning, and damaged ones skipped in favour of the previous one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from launcher.train.checkpoint.store import (
    KEY_ENV,
    CheckpointWarning,
    CheckpointWriteError,
    CheckpointWriter,
    complete_checkpoints,
    latest_valid,
    verify,
)

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.


def engine_writer(payload: bytes):
    """Stands in for an engine's save(): writes two shard files into the folder it is given."""

    def write(directory: Path) -> list[Path]:
        files = [directory / "shard_0.bin", directory / "shard_1.bin"]
        for i, f in enumerate(files):
            f.write_bytes(payload + bytes([i]) * 1000)
        return files

    return write


def save_steps(root: Path, steps: list[int], keep_last: int = 5) -> CheckpointWriter:
    writer = CheckpointWriter(root, rank=0, keep_last=keep_last, barrier=lambda: None)
    for step in steps:
        writer.save(step, engine_writer(f"step{step}".encode()), {"step": step, "sampler": {}})
    return writer


def test_save_writes_manifest_and_prunes(tmp_path: Path) -> None:
    save_steps(tmp_path, [2, 4, 6, 8], keep_last=2)
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [8, 6]
    manifest = json.loads((tmp_path / "step_00000008" / "manifest.json").read_text())
    assert set(manifest["files"]) == {
        "engine/shard_0.bin",
        "engine/shard_1.bin",
        "trainer_state.json",
    }
    assert not list(tmp_path.glob(".tmp-*"))
    found = latest_valid(tmp_path)
    assert found is not None and found.step == 8 and found.trainer_state["step"] == 8


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest"])
def test_damaged_latest_is_skipped_loudly(tmp_path: Path, damage: str) -> None:
    save_steps(tmp_path, [4, 8])
    shard = tmp_path / "step_00000008" / "engine" / "shard_1.bin"
    if damage == "flip":
        data = bytearray(shard.read_bytes())
        data[10] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "delete":
        shard.unlink()
    else:
        (tmp_path / "step_00000008" / "manifest.json").write_text("{not json")
    with pytest.warns(CheckpointWarning, match="step_00000008 is damaged"):
        found = latest_valid(tmp_path)
    assert found is not None and found.step == 4


def test_unfinished_write_is_ignored(tmp_path: Path) -> None:
    save_steps(tmp_path, [4])
    # A crash mid-write leaves a .tmp- folder: never taken for a checkpoint.
    (tmp_path / ".tmp-step_00000008" / "engine").mkdir(parents=True)
    found = latest_valid(tmp_path)
    assert found is not None and found.step == 4


def test_a_failing_engine_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    writer = save_steps(tmp_path, [4])

    def broken(directory: Path) -> list[Path]:
        (directory / "half.bin").write_bytes(b"x" * 10)
        raise OSError(28, "No space left on device")

    with pytest.raises(CheckpointWriteError, match=r"disk full writing .* GiB free"):
        writer.save(8, broken, {"step": 8})
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [4]
    assert latest_valid(tmp_path).step == 4  # type: ignore[union-attr]


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.mark.integration
@pytest.mark.skipif(not _can_mount(), reason="mounting a small tmpfs needs root")
def test_disk_full_on_a_real_small_tmpfs(tmp_path: Path) -> None:
    """A real 1 MiB tmpfs: the second checkpoint cannot fit; it fails cleanly, the first stays."""
    mount_point = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        root = mount_point / "checkpoints"
        writer = CheckpointWriter(root, rank=0, keep_last=3, barrier=lambda: None)

        def big(n: int):
            def write(directory: Path) -> list[Path]:
                (directory / "weights.bin").write_bytes(b"w" * n)
                return [directory / "weights.bin"]

            return write

        writer.save(1, big(400_000), {"step": 1})
        with pytest.raises(CheckpointWriteError, match="disk full writing"):
            writer.save(2, big(800_000), {"step": 2})
        found = latest_valid(root)
        assert found is not None and found.step == 1
        assert [s for s, _ in complete_checkpoints(root)] == [1]
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def test_renamed_folder_and_empty_manifest_are_rejected(tmp_path: Path) -> None:
    save_steps(tmp_path, [2, 4])
    # An attacker (or a typo) renames step 2 to a higher step: its manifest says 2.
    os.rename(tmp_path / "step_00000002", tmp_path / "step_00000009")
    assert "says step 2" in (verify(tmp_path / "step_00000009") or "")
    # An empty manifest lists nothing to check: rejected, not trusted.
    (tmp_path / "step_00000004" / "manifest.json").write_text(
        json.dumps({"format": "llmtrain-checkpoint-v2", "step": 4, "files": {}, "total_bytes": 0})
    )
    assert "does not list" in (verify(tmp_path / "step_00000004") or "")
    with pytest.warns(CheckpointWarning):
        assert latest_valid(tmp_path) is None


def test_extra_files_and_symlinks_are_rejected(tmp_path: Path) -> None:
    save_steps(tmp_path, [2])
    folder = tmp_path / "step_00000002"
    (folder / "engine" / "planted.pt").write_bytes(b"x")
    assert "not in manifest.json" in (verify(folder) or "")
    (folder / "engine" / "planted.pt").unlink()
    shard = folder / "engine" / "shard_0.bin"
    target = tmp_path / "elsewhere.bin"
    shutil.copy(shard, target)
    shard.unlink()
    shard.symlink_to(target)
    assert "symbolic link" in (verify(folder) or "")


def test_signed_manifests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "k1")
    save_steps(tmp_path, [2])
    folder = tmp_path / "step_00000002"
    assert verify(folder) is None
    # Rewrite a file and its manifest consistently: sha256 agrees, the signature does not.
    shard = folder / "engine" / "shard_0.bin"
    shard.write_bytes(b"evil" + shard.read_bytes()[4:])
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["engine/shard_0.bin"]["sha256"] = hashlib.sha256(
        shard.read_bytes()
    ).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert "signature does not match" in (verify(folder) or "")
    monkeypatch.delenv(KEY_ENV)
    assert verify(folder) is None  # without the key only the sha256 values are checked
    monkeypatch.setenv(KEY_ENV, "k1")
    del manifest["hmac_sha256"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert "not signed" in (verify(folder) or "")


def test_pruning_counts_only_verified_checkpoints(tmp_path: Path) -> None:
    """Damaged newer folders must not push the new good checkpoint out (issue 13)."""
    save_steps(tmp_path, [2])
    for step in (50, 60):  # damaged 'newer' checkpoints: renamed copies of step 2
        shutil.copytree(tmp_path / "step_00000002", tmp_path / f"step_000000{step}")
    writer = save_steps(tmp_path, [4, 6], keep_last=2)
    steps = [s for s, _ in complete_checkpoints(tmp_path)]
    assert 6 in steps and 4 in steps and 2 not in steps  # the two newest verified kept
    assert 50 in steps and 60 in steps  # damaged ones are left alone, never counted
    writer.save(8, engine_writer(b"s8"), {"step": 8, "sampler": {}})
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [60, 50, 8, 6]


def test_saving_the_same_step_again_replaces_it_atomically(tmp_path: Path) -> None:
    save_steps(tmp_path, [4])
    save_steps(tmp_path, [4])
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [4]
    assert verify(tmp_path / "step_00000004") is None
    assert not list(tmp_path.glob(".tmp-*"))
