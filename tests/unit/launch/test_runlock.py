"""One run per directory: the lock refuses a second holder and explains a dead one's record."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.launch import runlock
from launcher.rundir import RunDir

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.


def test_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = runlock.acquire(tmp_path)
    try:
        record = json.loads(RunDir(tmp_path).lock.read_text())
        assert record["host"] == socket.gethostname()
        with pytest.raises(runlock.RunDirLocked) as refused:
            runlock.acquire(tmp_path)
        assert refused.value.exit_code == 2
        assert f"pid {record['pid']} on host {record['host']}" in str(refused.value)
    finally:
        first.release()
    again = runlock.acquire(tmp_path)  # released: free again, and no stale note (clean release)
    assert again.note is None
    again.release()


@pytest.mark.integration
def test_a_dead_holder_is_detected_and_explained(tmp_path: Path) -> None:
    # A real process takes the lock and dies without releasing it (as kill -9 would).
    code = (
        "import os, sys; from launcher.launch import runlock; "
        f"runlock.acquire({str(tmp_path)!r}); print(os.getpid()); os._exit(0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    dead = int(done.stdout)
    lock = runlock.acquire(tmp_path)
    try:
        assert lock.note is not None
        assert f"pid {dead}" in lock.note and "is no longer running" in lock.note
    finally:
        lock.release()


def test_a_symlinked_lock_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("x")
    RunDir(tmp_path).lock.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(runlock.UserError, match="symbolic link"):
        runlock.acquire(tmp_path)
