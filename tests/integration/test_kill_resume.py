"""kill -9 of a rank mid-run: the launcher stops the job; the next run resumes from the latest
valid checkpoint; the final weights equal an uninterrupted run's bit for bit (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults import TRIAL_ARGS, llmtrain_run, run_and_kill, weights_digest

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_kill_minus_nine_then_resume_matches(tmp_path: Path, backend: str) -> None:
    args = [*TRIAL_ARGS, f"backend={backend}", "zero.stage=2"]
    reference, trial = tmp_path / "reference", tmp_path / "trial"
    reference.mkdir()
    trial.mkdir()
    done = llmtrain_run(reference, args)
    assert done.returncode == 0, done.stderr[-3000:]

    run_dir = trial / "runs" / "trial"
    code = run_and_kill(trial, args, run_dir, kill_after_step=5, rank=1)
    assert code == 1, "the killed run must fail, not finish"
    assert not (run_dir / "summary.json").exists()
    resumed = llmtrain_run(trial, args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert weights_digest(trial) == weights_digest(reference)
