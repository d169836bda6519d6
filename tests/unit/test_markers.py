"""Markers say what a test does: a unit test that starts a process fails (tests/process_guard.py,
installed by tests/conftest.py around every unit test's setup, call and teardown), an
integration test may start one, and every test has its tier."""

from __future__ import annotations

import _posixsubprocess
import multiprocessing
import os
import subprocess
import sys

import pytest

from tests.process_guard import ProcessStarted, no_processes

# Unit tests (no marker: tests/conftest.py marks them); the one that starts a process is marked
# integration.


def test_this_unit_test_runs_under_the_guard(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("integration") is None
    # conftest.py put the refusal in place for this test.
    for spawner in (subprocess._fork_exec, _posixsubprocess.fork_exec, os.fork, os.system):  # type: ignore[attr-defined]
        assert getattr(spawner, "refuses_processes", False), spawner


def test_every_way_to_start_a_process_is_refused_and_recorded() -> None:
    with no_processes("tests/unit/example.py::test") as attempts:
        with pytest.raises(ProcessStarted, match=r"example\.py::test is marked unit"):
            subprocess.run([sys.executable, "-c", "pass"], check=False)
        with pytest.raises(ProcessStarted):
            os.system("true")
        with pytest.raises(ProcessStarted):
            os.fork()
        with pytest.raises(ProcessStarted):
            multiprocessing.get_context("fork").Process(target=print).start()
        with pytest.raises(ProcessStarted):
            multiprocessing.get_context("spawn").Process(target=print).start()
        # Code under test that catches Exception (or OSError) cannot hide the attempt.
        try:
            subprocess.run(["true"], check=False)
        except Exception:
            pass
        except ProcessStarted:
            pass
    assert attempts == [
        "subprocess._fork_exec",
        "os.system",
        "os.fork",
        "os.fork",
        "_posixsubprocess.fork_exec",
        "subprocess._fork_exec",
    ]


@pytest.mark.integration
def test_an_integration_test_may_start_a_process(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is None
    done = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True)
    assert done.stdout == "42\n"
