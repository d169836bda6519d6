"""Shared fixtures. Rich wraps at 80 columns under CliRunner: tests set a wide terminal first.

With pytest-xdist (`-n 2`, the README's test command) the unit tests spread over the workers, while
every test that starts processes runs on one worker, one at a time, in file order, as without xdist.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Any

import pytest

os.environ.setdefault("COLUMNS", "200")
os.environ.setdefault("TERMINAL_WIDTH", "200")
# plan prices from a cached operator profile (llmtrain calibrate) when one exists: tests read and
# write an empty cache of their own, never the developer's ~/.cache/llmtrain/profiles.
os.environ["LLMTRAIN_PROFILE_DIR"] = tempfile.mkdtemp(prefix="llmtrain-test-profiles-")
atexit.register(shutil.rmtree, os.environ["LLMTRAIN_PROFILE_DIR"], True)


# Tests that start processes: torchrun ranks, DeepSpeed, a SLURM cluster on fixed ports,
# session-wide reference launches. Under pytest-xdist they all run on one worker, one at a time,
# in file order.
PROCESS_DIRS = ("tests/integration/", "tests/slurm/", "tests/gpu/")
PROCESS_MARKERS = ("integration", "slurm", "gpu")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: only called when it is installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's load-scope scheduler with one scope for every test under PROCESS_DIRS (the largest,
    so the first handed out) and one scope per unit test: the unit tests spread over the other
    workers while the process tests run in order on one (whatever --dist says)."""
    from xdist.scheduler import LoadScopeScheduling

    class ProcessesOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "processes" if nodeid.startswith(PROCESS_DIRS) else nodeid

    return ProcessesOnOneWorker(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that starts processes must live under PROCESS_DIRS, or xdist would run it beside
    another one."""
    misplaced = [
        item.nodeid
        for item in items
        if any(item.get_closest_marker(name) for name in PROCESS_MARKERS)
        and not item.nodeid.startswith(PROCESS_DIRS)
    ]
    if misplaced:
        raise pytest.UsageError(
            f"tests marked {'/'.join(PROCESS_MARKERS)} belong under {', '.join(PROCESS_DIRS)}: "
            + ", ".join(misplaced)
        )
