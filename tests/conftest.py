"""Shared fixtures. Rich wraps at 80 columns under CliRunner: tests set a wide terminal first.

With pytest-xdist (`-n 2`, the README's test command) each file of tests that start processes is
one unit of work (its module- and session-scoped reference launches run once, its tests in order
on one worker), handed out largest first; the unit tests, one unit each, fill the workers after.
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
# The key that signs output markers (launcher/output_marker.py): the tests' own, never the user's.
os.environ["LLMTRAIN_OUTPUT_KEY_FILE"] = os.path.join(os.environ["LLMTRAIN_PROFILE_DIR"], "out.key")


# Tests that start processes: torchrun ranks, DeepSpeed, a SLURM cluster on fixed ports (one
# file), reference launches shared by a file's tests. Under pytest-xdist a file runs on one worker,
# in order; two files may run at once (they rendezvous on localhost:0 and work in tmp_path).
# Measured on this 2-core box (2026-11-27): the process files take 1,139 s and the unit tests
# 314 s; one worker for all process files finished after 1,152 s with the other idle from 336 s.
PROCESS_DIRS = ("tests/integration/", "tests/slurm/", "tests/gpu/")
PROCESS_MARKERS = ("integration", "slurm", "gpu")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: only called when it is installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's load-scope scheduler with one scope per file under PROCESS_DIRS and one per unit
    test (whatever --dist says). Scopes go out largest first (most tests), so the process files
    start at once on every worker and the one-test unit scopes fill in at the end."""
    from xdist.scheduler import LoadScopeScheduling

    class ProcessFilesWhole(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid.split("::", 1)[0] if nodeid.startswith(PROCESS_DIRS) else nodeid

    return ProcessFilesWhole(config, log)


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
