"""kill -9 of a rank mid-run: the launcher stops the job; the next run resumes from the latest
valid checkpoint; the final weights equal an uninterrupted run's bit for bit (CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults import run_and_kill

pytestmark = pytest.mark.integration

ARGS = [
    "train.steps=12",
    "model.seq_length=64",
    "train.micro_batch_size=4",
    "optim.warmup_steps=2",
    "cluster.gpus_per_node=2",
    "checkpoint.every_steps=2",
    "run.name=trial",
]


def digest(run_dir: Path) -> str:
    return json.loads((run_dir / "summary.json").read_text())["weights_sha256"]


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_kill_minus_nine_then_resume_matches(tmp_path: Path, backend: str) -> None:
    args = [*ARGS, f"backend={backend}", "zero.stage=2"]
    reference = tmp_path / "reference"
    reference.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "run", *args],
        cwd=reference,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    trial = tmp_path / "trial"
    trial.mkdir()
    run_dir = trial / "runs" / "trial"
    code = run_and_kill(trial, args, run_dir, kill_after_step=5, rank=1)
    assert code == 1, "the killed run must fail, not finish"
    assert not (run_dir / "summary.json").exists()
    resumed = subprocess.run(
        [sys.executable, "-m", "launcher", "run", *args],
        cwd=trial,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert digest(run_dir) == digest(reference / "runs" / "trial")
