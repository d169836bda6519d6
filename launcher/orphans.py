"""No orphans: every process llmtrain starts dies with the process that started it (no torch
import: the ranks arm this before importing anything heavy).

Linux's PR_SET_PDEATHSIG (prctl(2)) sends a signal to a process when its parent thread exits. It
only takes effect from the prctl call on: a parent that died before it is missed, and the orphan is
then reparented to the nearest child subreaper (PR_SET_CHILD_SUBREAPER: tmux, systemd services,
containers' init), not necessarily to pid 1. So after arming, a process compares its parent with
the parent it recorded before (the pid that started it) and stops itself when they differ; a
rank under torchrun also checks that its parent (torchrun) is still the child of the `llmtrain`
recorded in ``LAUNCHER_PID_ENV``, which catches torchrun dying before the rank could even record
its parent (a one-process run's rank is llmtrain's own child: its parent is that pid).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
# Set by `llmtrain run` for torchrun and the ranks: the pid of the llmtrain process.
LAUNCHER_PID_ENV = "LLMTRAIN_LAUNCHER_PID"


def _parent_of(pid: int) -> int | None:
    """The parent pid of `pid` from /proc (None when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # pid (comm) state ppid ...: comm may hold spaces and parentheses, split after it.
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def die_with_parent(parent: int, sig: int = signal.SIGKILL, grandparent: int | None = None) -> None:
    """Have Linux send `sig` to this process when its parent exits, and send it now if the
    parent is no longer `parent` (it died before the call: we were reparented, to pid 1 or a
    subreaper), or, given `grandparent`, when the parent is no longer that pid's child.
    Elsewhere than Linux: no-op."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    orphaned = os.getppid() != parent
    if not orphaned and grandparent is not None:
        orphaned = _parent_of(parent) not in (grandparent, None)
    if orphaned:
        os.kill(os.getpid(), sig)


def arm_rank() -> None:
    """In a rank, first thing: die with its parent when it started (torchrun; llmtrain itself for
    a one-process run, which starts the trainer without torchrun), and, under torchrun, with the
    llmtrain that started torchrun when ``LAUNCHER_PID_ENV`` names it."""
    launcher = os.environ.get(LAUNCHER_PID_ENV, "")
    parent = os.getppid()
    llmtrain = int(launcher) if launcher.isdigit() else None
    die_with_parent(parent, grandparent=None if llmtrain == parent else llmtrain)
