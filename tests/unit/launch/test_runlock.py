"""One run per directory: the lock refuses a second holder and explains a dead one's record."""

from __future__ import annotations

import json
import os
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


# A rank handed the lock (a one-process `llmtrain run`), as launcher.train.loop starts: forks a
# child (as a DataLoader worker is forked) and execs one (close_fds=False, as os.system does);
# prints whether each still had the lock's descriptor.
RANK_WITH_LOCK = """
import os, subprocess, sys
from launcher.runfiles import LOCK_ENV, keep_lock_from_children
fd = int(sys.argv[1])
assert keep_lock_from_children(os.environ[LOCK_ENV]) == fd
pid = os.fork()
if pid == 0:
    try:
        os.fstat(fd)
        os._exit(1)
    except OSError:
        os._exit(0)
_, status = os.waitpid(pid, 0)
forked = "closed" if os.waitstatus_to_exitcode(status) == 0 else "open"
probe = f"import os\\ntry:\\n    os.fstat({fd}); print('open')\\n"
probe += "except OSError:\\n    print('closed')"
execd = subprocess.run([sys.executable, "-c", probe], close_fds=False, capture_output=True,
                       text=True).stdout.strip()
os.fstat(fd)  # the rank itself keeps it
print(forked, execd)
"""


@pytest.mark.integration
def test_a_rank_holding_the_lock_keeps_it_from_the_processes_it_starts(tmp_path: Path) -> None:
    """Else a worker the rank forked holds the flock after llmtrain and the rank died (kill -9),
    and the folder stays locked under a dead pid's record."""
    from launcher.runfiles import LOCK_ENV

    lock = runlock.acquire(tmp_path)
    try:
        done = subprocess.run(
            [sys.executable, "-c", RANK_WITH_LOCK, str(lock.fd)],
            pass_fds=(lock.fd,),
            env={**os.environ, **lock.identity_env()},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["closed", "closed"], done.stdout
        assert lock.identity_env()[LOCK_ENV].startswith(f"{os.fstat(lock.fd).st_ino}:")
    finally:
        lock.release()
