"""A run directory's state read from its files (launcher/launch/local_runs.py), hostile ones too."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest

from launcher.errors import UserError
from launcher.launch.local_runs import find_run, list_runs, run_info

pytestmark = pytest.mark.unit


def make_run(root: Path, name: str, steps: int = 10, done_steps: int = 4) -> Path:
    folder = root / name
    (folder / "logs").mkdir(parents=True)
    (folder / "config.yaml").write_text(f"recipe: tiny\ntrain:\n  steps: {steps}\n")
    lines = [json.dumps({"step": s, "loss": 5.0 - s / 10}) for s in range(1, done_steps + 1)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def touch_later(path: Path, text: str = "{}", after: float = 1.0) -> None:
    path.write_text(text)
    later = time.time() + after
    os.utime(path, (later, later))


def test_states_from_files(tmp_path: Path) -> None:
    folder = make_run(tmp_path, "a")
    info = run_info(folder)
    # Stopped with nothing recorded (kill -9): resumable, so "interrupted"; step 4 of 10.
    assert (info.status, info.step, info.total, info.recipe) == ("interrupted", 4, 10, "tiny")
    assert info.loss == pytest.approx(4.6)
    touch_later(folder / "logs" / "rank0.error.json")
    assert run_info(folder).status == "failed"
    touch_later(folder / "preempted.json", after=2.0)  # interrupted after the failure
    assert run_info(folder).status == "interrupted"
    touch_later(folder / "summary.json", after=3.0)  # then resumed and finished
    assert run_info(folder).status == "done"


def test_running_is_the_kernel_lock_not_the_record(tmp_path: Path) -> None:
    folder = make_run(tmp_path, "b")
    lock = folder / ".llmtrain.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        info = run_info(folder)
        assert (info.status, info.holder_pid) == ("running", os.getpid())
    finally:
        os.close(fd)
    # A record naming this (live) process, with no flock held: not running.
    lock.write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    assert run_info(folder).status == "interrupted"


def test_hostile_files_never_crash_or_count(tmp_path: Path) -> None:
    folder = make_run(tmp_path, "c")
    (folder / "metrics.jsonl").write_text("[" * 3_000_000 + "\n")  # 3 MB deep
    (folder / "config.yaml").write_text("a: &x [1]\nb: *x\n" + "- ]" * 10)
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    (folder / "summary.json").symlink_to(target)  # a link is not this run's summary
    info = run_info(folder)
    assert (info.status, info.step, info.loss, info.total) == ("interrupted", None, None, None)


def test_find_by_path_name_and_prefix(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    make_run(root, "tiny-70e2e023")
    make_run(root, "tiny-81aa0000")
    make_run(root, "gpt-7b-1234abcd")
    assert find_run("gpt", root) == (root / "gpt-7b-1234abcd").resolve()
    assert find_run(str(root / "tiny-70e2e023"), root) == (root / "tiny-70e2e023").resolve()
    assert find_run("tiny-7", root) == (root / "tiny-70e2e023").resolve()
    with pytest.raises(UserError, match="names 2 runs"):
        find_run("tiny", root)
    assert find_run("12345", root) is None  # left to SLURM
    assert find_run("../runs", root) is None
    (root / "not-a-run").mkdir()
    assert [i.name for i in list_runs(root)] and "not-a-run" not in [
        i.name for i in list_runs(root)
    ]
