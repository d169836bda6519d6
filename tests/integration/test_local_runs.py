"""Local runs as first-class objects, on a real `llmtrain run` (one CPU process, tiny model):
`runs` lists it as running with its step, `status` and `logs` take its name, `cancel NAME` stops
it as Ctrl-C would (checkpoint, exit 130) and only then does `status` say interrupted."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli import invoke, llmtrain, start
from tests.faults import steps_done

pytestmark = pytest.mark.integration

ARGS = ["model.seq_length=32", "train.micro_batch_size=4", "train.steps=100000", "run.name=mine"]


def _runs(cwd: Path) -> list[dict[str, object]]:
    listed = invoke("runs", "--json", cwd=cwd, timeout=60)
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout)["runs"])


def test_list_status_logs_and_cancel_a_local_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "mine"
    process = start("run", *ARGS, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 180
        while steps_done(run_dir) < 2:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.1)
        (listed,) = _runs(tmp_path)
        assert (listed["name"], listed["status"], listed["recipe"]) == ("mine", "running", "tiny")
        assert listed["pid"] == process.pid  # the kernel's lock table names the launcher
        assert isinstance(listed["step"], int) and listed["step"] >= 2
        assert listed["total_steps"] == 100000
        status = invoke("status", "mine", cwd=tmp_path, timeout=60)
        assert status.returncode == 0 and "mine (tiny): running" in status.stdout, status
        logs = invoke("logs", "mi", cwd=tmp_path, timeout=60)  # a unique prefix of the name
        assert logs.returncode == 0 and "rank0 training tiny" in logs.stdout, logs

        cancelled = llmtrain("cancel", "mine", cwd=tmp_path, timeout=180)
        assert cancelled.returncode == 0, cancelled.stderr
        assert "stopped at step" in cancelled.stdout and "(interrupted)" in cancelled.stdout
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    step = steps_done(run_dir)
    assert (run_dir / "checkpoints" / f"step_{step:08d}" / "manifest.json").is_file()
    (listed,) = _runs(tmp_path)
    assert listed["status"] == "interrupted" and listed["pid"] is None
    again = llmtrain("cancel", "mine", cwd=tmp_path, timeout=60)
    assert again.returncode == 2 and "is not running (interrupted)" in again.stderr
    # A local stop's own wording, on screen and in rank 0's log: no SLURM requeue talk.
    rank0 = (run_dir / "logs" / "rank0.log").read_text()
    assert f"checkpoint written at step {step}; run the same command again" in rank0, rank0
    assert "requeue" not in stderr and "requeue" not in rank0


def test_a_forged_lock_record_never_gets_a_process_signalled(tmp_path: Path) -> None:
    # A run directory whose lock record names a live process that is not llmtrain (and holds no
    # lock): runs says interrupted, cancel refuses, the process lives on.
    run_dir = tmp_path / "runs" / "forged"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("recipe: tiny\ntrain:\n  steps: 10\n")
    victim = subprocess.Popen(["sleep", "60"])
    try:
        record = {"pid": victim.pid, "host": os.uname().nodename, "time": time.time()}
        (run_dir / ".llmtrain.lock").write_text(json.dumps(record))
        (listed,) = _runs(tmp_path)
        assert listed["status"] == "interrupted" and listed["pid"] is None
        refused = llmtrain("cancel", "forged", cwd=tmp_path, timeout=60)
        assert refused.returncode == 2 and "not running" in refused.stderr
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
