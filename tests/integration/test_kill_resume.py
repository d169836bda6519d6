"""kill -9 of a rank mid-run: the launcher stops the job; the next run resumes from the latest
valid checkpoint; the final weights equal an uninterrupted run's bit for bit (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults import KILLED_STDERR, TRIAL_ARGS, llmtrain_run, run_and_kill, weights_digest

pytestmark = pytest.mark.integration


# Kill points after the first checkpoint (every 2 steps): (step, rank) per backend. Several kill
# points hit one trial in turn: each run resumes the one killed before it, until the last is killed.
KILLS = {"torch": [(3, 0), (8, 1)], "deepspeed": [(5, 1)]}


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_kill_minus_nine_then_resume_matches(tmp_path: Path, backend: str) -> None:
    args = [*TRIAL_ARGS, f"backend={backend}", "zero.stage=2"]
    reference = tmp_path / "reference"
    reference.mkdir()
    done = llmtrain_run(reference, args)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = weights_digest(reference)
    assert expected is not None

    trial = tmp_path / "trial"
    trial.mkdir()
    run_dir = trial / "runs" / "trial"
    for i, (step, rank) in enumerate(KILLS[backend]):
        code = run_and_kill(trial, args, run_dir, kill_after_step=step, rank=rank)
        assert code == 1, "the killed run must fail, not finish"
        stderr = (trial / KILLED_STDERR).read_text()
        assert f"rank {rank} failed first: killed by SIGKILL" in stderr, stderr
        if i:  # this run had resumed the one killed before it (rank 0's log, appended)
            assert "resumed from" in (run_dir / "logs" / "rank0.log").read_text()
        assert not (run_dir / "summary.json").exists()
    resumed = llmtrain_run(trial, args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert weights_digest(trial) == expected
