"""`llmtrain run --detach`: the run goes on in the background, in a session of its own, after the
terminal that started it closes (a logout's SIGHUP goes to the terminal's session; this one is
another), with its output in its run directory.

The command is run again as a child (``llmtrain run --detached-child ...``, a new session, stdin
from /dev/null, stdout and stderr to a pipe) that validates, plans and takes the run directory's
lock itself, so the lock's holder (what `status` and `cancel` look for) is the process that runs
torchrun (or the one rank). Until it holds the lock, the child's messages (a refusal, exit 2) reach
the terminal through the pipe and the parent exits with the child's code; once it holds the lock it
says so on the pipe (``HANDOVER`` and the run directory as JSON), points its stdout and stderr at
``logs/launcher.log`` and trains; the parent prints where the run is and how to follow it, and exits
0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher import fsio
from launcher.rundir import RunDir

HANDOVER = "llmtrain-detached "
CHILD_OPTION = "--detached-child"


def launcher_log(run_dir: Path) -> Path:
    """Where a detached run's `llmtrain` writes what it would have printed."""
    return RunDir(Path(run_dir)).launcher_log


@dataclass(frozen=True)
class Detached:
    run_dir: Path
    pid: int

    @property
    def name(self) -> str:
        return self.run_dir.name


@dataclass(frozen=True)
class Refused:
    """The child stopped before it held the run directory: its exit code and what it said."""

    exit_code: int
    said: str


def start(args: list[str], relay: bool = True) -> Detached | Refused:
    """Start ``llmtrain run --detached-child ARGS`` in a session of its own; copy its messages
    to stderr (with `relay`) until it holds the run directory's lock. Returns where it runs, or
    how it stopped before (a refusal: exit 2 and its message)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "launcher", "run", CHILD_OPTION, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
    )
    assert child.stdout is not None
    said = []
    for raw in child.stdout:
        line = raw.decode("utf-8", "replace")
        if line.startswith(HANDOVER):
            document = json.loads(line[len(HANDOVER) :])
            child.stdout.close()
            return Detached(Path(document["run_dir"]), child.pid)
        said.append(line)
        if relay:
            sys.stderr.write(line)
            sys.stderr.flush()
    child.stdout.close()
    return Refused(child.wait(), "".join(said))


def hand_over(run_dir: Path) -> None:
    """In the child, holding the lock: tell the parent where the run is, then write everything
    to ``logs/launcher.log`` (the parent and its terminal may be gone from here on)."""
    run = RunDir(Path(run_dir))
    log = fsio.open_append(launcher_log(run.root), root=run.root, binary=True)
    sys.stdout.write(HANDOVER + json.dumps({"run_dir": str(run.root)}) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    log.close()
