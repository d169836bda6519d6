"""Shared fixtures. Rich wraps at 80 columns under CliRunner: tests set a wide terminal first.

With pytest-xdist (`-n 3`, the README's test command) each file of tests that start processes is
one unit of work (its module- and session-scoped reference launches run once, its tests in order
on one worker) and each other test one unit; units go out costliest first, by a measured table
(tests/schedule.py). Each test has one tier marker, and a unit test cannot start a process
(tests/process_guard.py).
"""

from __future__ import annotations

import atexit
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from tests.process_guard import no_processes
from tests.schedule import PROCESS_DIRS, make_scheduler, register_recorder

# CPython's platform.processor() runs `uname -p` once per interpreter and keeps the answer;
# deepspeed asks when imported. Asked here, before any unit test runs under the process guard.
platform.processor()
# xdist workers on two cores: torch's intra-op threads (one per core by default) in each
# worker and each child process oversubscribe the cores, and OpenMP's spinning threads wait on
# each other (measured here: tests/unit/train with -n 2 took 36.9 s, 18.6 s with one thread).
# Set before torch is imported; child processes inherit it (a run's launch.sh sets it anyway).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Some machines set PYTHONDONTWRITEBYTECODE for every process (this one and its CI do): then each of
# the ~500 Python processes the suite starts (launchers, torchrun agents, ranks, CLI children)
# compiles llmtrain's modules from source again, ~0.11 CPU s a process on the 2-core box (0.23 s
# to import them without a cache, 0.12 s with one). The tests and their children may cache
# bytecode (__pycache__/, ignored by git); nothing else about Python changes.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
os.environ.setdefault("COLUMNS", "200")
os.environ.setdefault("TERMINAL_WIDTH", "200")
# plan prices from a cached operator profile (llmtrain calibrate) when one exists: tests read and
# write an empty cache of their own, never the developer's ~/.cache/llmtrain/profiles.
os.environ["LLMTRAIN_PROFILE_DIR"] = tempfile.mkdtemp(prefix="llmtrain-test-profiles-")
atexit.register(shutil.rmtree, os.environ["LLMTRAIN_PROFILE_DIR"], True)
# The key that signs output markers (launcher/output_marker.py): the tests' own, never the user's.
os.environ["LLMTRAIN_OUTPUT_KEY_FILE"] = os.path.join(os.environ["LLMTRAIN_PROFILE_DIR"], "out.key")


# Tests that start processes: torchrun ranks, DeepSpeed, a SLURM cluster on fixed ports (one
# file), reference launches shared by a file's tests. Under pytest-xdist a file there is one unit
# of work (tests/schedule.py); two files may run at once (they rendezvous on localhost:0 and work
# in tmp_path).
PROCESS_MARKERS = ("integration", "slurm", "gpu")
UNIT_DIR = "tests/unit/"


def pytest_configure(config: pytest.Config) -> None:
    register_recorder(config)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: only called when it is installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole process files and single unit tests, costliest first (tests/schedule.py)."""
    return make_scheduler(config, log)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test has its tier: a test under tests/unit/ with no marker of its own is a unit test
    (no processes, enforced below); one there that starts a small process (a shell script, a
    fresh interpreter, a stub sbatch) is marked integration instead and runs alone like a unit
    test. Heavy ones (torchrun, DeepSpeed, SLURM, GPU) live under PROCESS_DIRS, or xdist would
    split their file's shared launches over both workers."""
    problems = []
    for item in items:
        tiers = [name for name in ("unit", *PROCESS_MARKERS) if item.get_closest_marker(name)]
        if not tiers and item.nodeid.startswith(UNIT_DIR):
            item.add_marker(pytest.mark.unit)
        elif "unit" in tiers and len(tiers) > 1:
            problems.append(f"{item.nodeid} is marked both {' and '.join(tiers)}")
        elif {"slurm", "gpu"} & set(tiers) and not item.nodeid.startswith(PROCESS_DIRS):
            problems.append(f"{item.nodeid} belongs under {', '.join(PROCESS_DIRS)}")
        elif tiers and not item.nodeid.startswith((*PROCESS_DIRS, UNIT_DIR)):
            problems.append(f"{item.nodeid} is outside {', '.join((*PROCESS_DIRS, UNIT_DIR))}")
    if problems:
        raise pytest.UsageError("test markers: " + "; ".join(problems))


def _no_processes_in_unit_tests(item: pytest.Item) -> Generator[None, object, object]:
    """A unit test that starts a process fails (tests/process_guard.py): the marker says what
    the test does."""
    if not item.get_closest_marker("unit"):
        return (yield)
    with no_processes(item.nodeid) as attempts:
        result = yield
    if attempts:
        pytest.fail(f"{item.nodeid} is marked unit but started a process ({', '.join(attempts)})")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _no_processes_in_unit_tests(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _no_processes_in_unit_tests(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    if nextitem is None:
        # The worker's last test: the session's fixtures (the SLURM cluster, stopped by a
        # script) are finalised in its teardown too, and they are not this test's processes.
        return (yield)
    return (yield from _no_processes_in_unit_tests(item))


@pytest.fixture
def one_process_group() -> Iterator[None]:
    """A one-rank gloo process group in the test's own process (an in-memory store: no port, no
    process started), destroyed afterwards: what engine and checkpoint unit tests build under."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
