"""launcher.fsio: atomic writes, no symlink followed inside a run directory, plain disk errors."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from launcher import fsio
from launcher.rundir import RunDir, step_dir_name

pytestmark = pytest.mark.unit


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    fsio.write_json_atomic(target, {"a": 1}, root=tmp_path)
    fsio.write_text_atomic(target, "second\n", root=tmp_path, mode=0o755)
    assert target.read_text() == "second\n"
    assert os.stat(target).st_mode & 0o777 == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_planted_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").symlink_to(victim)
    fsio.write_text_atomic(run / "summary.json", "{}", root=run)
    assert victim.read_text() == "precious"
    assert not (run / "summary.json").is_symlink()


def test_appending_through_a_symlink_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(fsio.UnsafePathError, match="symbolic link"):
        fsio.open_append(run / "metrics.jsonl", root=run)
    # A symlinked folder inside the run directory is refused too.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rmdir(run / "logs")
    (run / "logs").symlink_to(elsewhere)
    with pytest.raises(fsio.UnsafePathError, match="logs is a symbolic link"):
        fsio.open_append(run / "logs" / "rank0.log", root=run)
    with pytest.raises(fsio.UnsafePathError):
        fsio.write_text_atomic(run / "logs" / "rank0.error.json", "{}", root=run)
    assert victim.read_text() == "precious" and not list(elsewhere.iterdir())


def test_sha256_refuses_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    assert fsio.sha256_file(tmp_path / "a").startswith("ba7816bf")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(OSError):
        fsio.sha256_file(tmp_path / "b")


def test_disk_full_fault_hook_and_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fsio.FAULT_DISK_FULL_ENV, "1")
    with pytest.raises(OSError) as full:
        fsio.write_text_atomic(tmp_path / "x", "data")
    assert not (tmp_path / "x").exists()
    text = fsio.describe_write_error(full.value, tmp_path / "x")
    assert text is not None and "disk full writing" in text and "GiB free" in text
    read_only = OSError(errno.EROFS, "Read-only file system", str(tmp_path))
    assert "read-only" in (fsio.describe_write_error(read_only, tmp_path) or "")
    assert fsio.describe_write_error(OSError(errno.ENOENT, "x"), tmp_path) is None


def test_torch_saves_short_write_reads_as_a_full_disk(tmp_path: Path) -> None:
    # What torch.save raises when the file system takes fewer bytes than it wrote.
    short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    text = fsio.describe_write_error(short, tmp_path) or ""
    assert text.startswith(f"disk full writing {tmp_path}") and "free" in text
    assert fsio.describe_write_error(RuntimeError("some other failure"), tmp_path) is None


def test_rundir_names_every_file(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    names = {
        run.config.name,
        run.plan.name,
        run.ds_config.name,
        run.launch_script.name,
        run.sbatch_script.name,
        run.slurm_jobs.name,
        run.metrics.name,
        run.tensorboard.name,
        run.checkpoints.name,
        run.summary.name,
        run.preempted.name,
        run.lock.name,
    }
    assert len(names) == 12
    assert run.rank_error(3) == tmp_path / "logs" / "rank3.error.json"
    assert run.rank_log(0).parent == run.logs and run.torchrun_log.parent == run.logs
    assert step_dir_name(42) == "step_00000042"
