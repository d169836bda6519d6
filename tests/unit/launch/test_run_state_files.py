"""What llmtrain reads back from a run directory is checked before it is used (issue 19, items 6
and 10): slurm.json job ids never become options of scancel (a stub scancel on PATH records its
argv), hostile nesting and sizes are a clean exit 2, run logs and the lock's record are never
trusted, and the lock's identity check sees a deleted or replaced lock file."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest

from launcher import runfiles
from launcher.launch import runlock
from launcher.rundir import RunDir
from tests.cli import invoke

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.

CONTENT = "content-of-a-file-llmtrain-must-never-print"


@pytest.fixture(autouse=True)
def no_compose_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMTRAIN_NO_CACHE", "1")


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def stub_slurm(tmp_path: Path) -> tuple[str, Path]:
    """Stub SLURM clients (stand-ins named as such: no cluster in unit tests). scancel records its
    argv, one line per call; scontrol knows no job; squeue lists none."""
    bin_dir = tmp_path / "stubbin"
    bin_dir.mkdir()
    calls = bin_dir / "scancel.calls"
    stub(bin_dir, "scancel", f'printf "%s\\n" "$*" >>{calls}\n')
    stub(bin_dir, "scontrol", "exit 1\n")
    stub(bin_dir, "squeue", "exit 0\n")
    return f"{bin_dir}:{os.environ['PATH']}", calls


def run_dir_with(tmp_path: Path, record: str | bytes) -> Path:
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    data = record.encode() if isinstance(record, str) else record
    (run_dir / "slurm.json").write_bytes(data)
    return run_dir


@pytest.mark.parametrize(
    "ids",
    [["--me"], ["-u", "root"], ["123 --me"], ["１２３"], [True], [-5], ["12;rm -rf ~"]],
)
def test_cancel_never_hands_a_recorded_value_to_scancel(
    tmp_path: Path, stub_slurm: tuple[str, Path], ids: list[object]
) -> None:
    path, calls = stub_slurm
    run_dir = run_dir_with(tmp_path, json.dumps({"job_ids": ids}))
    done = invoke("cancel", str(run_dir), cwd=tmp_path, env={"PATH": path})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not" in done.stderr and "Traceback" not in done.stderr
    assert not calls.exists(), calls.read_text()  # scancel never ran


@pytest.mark.integration
def test_cancel_puts_a_double_dash_before_the_ids(
    tmp_path: Path, stub_slurm: tuple[str, Path]
) -> None:
    path, calls = stub_slurm
    run_dir = run_dir_with(tmp_path, json.dumps({"job_ids": ["123", 124, "125_3"]}))
    done = invoke("cancel", str(run_dir), cwd=tmp_path, env={"PATH": path})
    assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines() == ["-- 123 124 125_3"]


@pytest.mark.parametrize("command", ["status", "logs", "cancel"])
@pytest.mark.parametrize("shape", ["3 MB deep", "deep but small", "huge"])
def test_a_hostile_slurm_record_is_a_clean_exit_2(
    tmp_path: Path, stub_slurm: tuple[str, Path], command: str, shape: str
) -> None:
    path, calls = stub_slurm
    n = {"3 MB deep": 3_000_000, "deep but small": 5_000}.get(shape, 0)
    record = (
        b'{"job_ids": ' + b"[" * n + b"]" * n + b"}"
        if n
        else b'{"job_ids": ["1"], "pad": "' + b"x" * (2 << 20) + b'"}'
    )
    run_dir = run_dir_with(tmp_path, record)
    done = invoke(command, str(run_dir), cwd=tmp_path, env={"PATH": path})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "slurm.json: not a readable SLURM record" in done.stderr
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
    assert ("nested" if shape == "deep but small" else "larger than") in done.stderr
    assert not calls.exists()


@pytest.mark.integration
@pytest.mark.parametrize("as_json", [False, True])
def test_logs_never_read_a_run_log_through_a_link(
    tmp_path: Path, stub_slurm: tuple[str, Path], as_json: bool
) -> None:
    path, _ = stub_slurm
    run_dir = run_dir_with(tmp_path, json.dumps({"job_ids": ["7"]}))
    (run_dir / "logs").mkdir()
    (tmp_path / "private.txt").write_text(CONTENT)
    (run_dir / "logs" / "slurm-7.out").symlink_to(tmp_path / "private.txt")
    done = invoke(
        "logs", str(run_dir), *(["--json"] if as_json else []), cwd=tmp_path, env={"PATH": path}
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "symbolic link" in (done.stdout + done.stderr)
    assert CONTENT not in done.stdout + done.stderr and "Traceback" not in done.stderr


def test_run_refuses_a_symlinked_torchrun_log_before_writing(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "t"
    (run_dir / "logs").mkdir(parents=True)
    (tmp_path / "target.log").write_text(CONTENT)
    (run_dir / "logs" / "torchrun.log").symlink_to(tmp_path / "target.log")
    done = invoke("run", "run.root_dir=runs", "run.name=t", "train.steps=2", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "torchrun.log is a symbolic link" in done.stderr and "Traceback" not in done.stderr
    assert not (run_dir / "config.yaml").exists()  # refused before the first write
    assert (tmp_path / "target.log").read_text() == CONTENT


@pytest.mark.integration
def test_status_survives_a_hostile_metrics_line(
    tmp_path: Path, stub_slurm: tuple[str, Path]
) -> None:
    path, _ = stub_slurm
    run_dir = run_dir_with(tmp_path, json.dumps({"job_ids": ["7"]}))
    (run_dir / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 2.0}\n' + "[" * 50_000 + "]" * 50_000 + "\n"
    )
    done = invoke("status", str(run_dir), cwd=tmp_path, env={"PATH": path})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "progress unknown" in done.stdout
    (run_dir / "metrics.jsonl").write_text('{"step": 3, "loss": "NaN-as-text"}\n')
    done = invoke("status", str(run_dir), cwd=tmp_path, env={"PATH": path})
    assert done.returncode == 0 and "progress: step 3" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize(
    "record",
    [
        "[" * 60_000 + "]" * 60_000,
        json.dumps({"pid": "--", "time": "yesterday", "host": "\x1b[31mred", "slurm_job": "-x"}),
    ],
)
def test_a_hostile_lock_record_is_never_trusted(tmp_path: Path, record: str) -> None:
    held = runlock.acquire(tmp_path)
    try:
        RunDir(tmp_path).lock.write_text(record)  # rewritten under the holder
        with pytest.raises(runlock.RunDirLocked) as refused:
            runlock.acquire(tmp_path)
        message = str(refused.value)
        assert "pid ? on host ?" in message and "\x1b" not in message
    finally:
        held.release()


def test_lock_identity_sees_a_deleted_or_replaced_lock(tmp_path: Path) -> None:
    lock = runlock.acquire(tmp_path)
    identity = lock.identity_env()[runfiles.LOCK_ENV]
    path = RunDir(tmp_path).lock
    assert runfiles.lock_problem(path, identity) is None
    record = json.loads(path.read_text())
    assert record["token"] == identity.split(":")[1] and record["host"] == socket.gethostname()
    path.unlink()  # deleted under the holder: a second run now gets a lock of its own
    assert "was deleted" in (runfiles.lock_problem(path, identity) or "")
    second = runlock.acquire(tmp_path)
    try:
        assert "replaced" in (runfiles.lock_problem(path, identity) or "")
        assert runfiles.lock_problem(path, second.identity_env()[runfiles.LOCK_ENV]) is None
    finally:
        second.release()
        lock.release()
    assert runfiles.lock_problem(path, None) is None  # a rank started without a lock: no check


def test_loads_bounds() -> None:
    assert runfiles.loads('{"a": [1, {"b": "[[[[[[[["}]}', max_depth=3) == {
        "a": [1, {"b": "[[[[[[[["}]
    }
    with pytest.raises(runfiles.RunFileError, match="nested 4 levels"):
        runfiles.loads("[[[[]]]]", max_depth=3)
    with pytest.raises(runfiles.RunFileError, match="larger than"):
        runfiles.loads("[" + " " * 100 + "]", max_bytes=50)
    assert [runfiles.is_job_id(t) for t in ("1", "12_3", "--me", "1_", "١٢")] == [
        True,
        True,
        False,
        False,
        False,
    ]


def test_a_deeply_nested_config_yaml_is_a_clean_exit_2(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "deep"
    (run_dir / "checkpoints" / "step_00000001").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("a: " + "[" * 200_000 + "]" * 200_000 + "\n")
    done = invoke("run", "run.root_dir=runs", "run.name=deep", "train.steps=2", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "config.yaml: not a config.yaml this llmtrain reads" in done.stderr
    assert "Traceback" not in done.stderr


def test_render_into_a_live_run_directory_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "live"
    run_dir.mkdir(parents=True)
    held = runlock.acquire(run_dir)
    try:
        done = invoke("render", "--out", str(run_dir), cwd=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "in use by another llmtrain run" in done.stderr
        assert not (run_dir / "config.yaml").exists()
    finally:
        held.release()
    assert invoke("render", "--out", str(run_dir), cwd=tmp_path).returncode == 0
    assert (run_dir / "config.yaml").is_file()
