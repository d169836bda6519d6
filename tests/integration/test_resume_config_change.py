"""A resume never silently changes what the run trains (issue 30 item 6).

The reviewer's sequence: `llmtrain run run.name=d train.steps=N`, then `llmtrain run run.name=d`
(train.steps not repeated, so the recipe's value came back and the schedule changed). Now the
second command is refused (exit 2, nothing in the run directory changes) naming the difference
and the exact command that resumes the run as it was; that command resumes it; a change that does
not alter the trajectory (logging cadence) is accepted and recorded in config_history.jsonl; a
trajectory change is accepted with --allow-config-change and recorded too.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from tests.cli import llmtrain

pytestmark = pytest.mark.integration

SHORT = ["model.seq_length=32", "train.micro_batch_size=2", "train.global_batch_size=2"]


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of the run directory but the lock's record, with its bytes."""
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".llmtrain.lock"
    }


def steps_logged(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if "loss" in json.loads(line)]


def history(run_dir: Path) -> list[dict[str, object]]:
    path = run_dir / "config_history.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_resume_that_changes_the_training_is_refused_with_the_command_that_resumes_it(
    tmp_path: Path,
) -> None:
    first = llmtrain("run", "run.name=d", *SHORT, "train.steps=3", cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "runs" / "d"
    before = snapshot(run_dir)

    # The reviewer's second command: train.steps not repeated (the recipe says 200).
    refused = llmtrain("run", "run.name=d", *SHORT, cwd=tmp_path, timeout=300)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    text = refused.stderr
    assert "train.steps: 3 -> 200 (not set on this command" in text, text
    assert "--allow-config-change" in text and "--fresh" in text
    assert snapshot(run_dir) == before  # nothing written, config.yaml included
    assert steps_logged(run_dir) == [1, 2, 3]

    # The command the message gives resumes the run as it was started.
    line = next(x for x in text.splitlines() if "to resume it as it was started:" in x)
    command = shlex.split(line.split("started:", 1)[1])
    assert command[:2] == ["llmtrain", "run"] and "train.steps=3" in command
    again = llmtrain(*command[1:], cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["steps"] == 3
    assert history(run_dir) == []  # nothing changed

    # A change that does not alter the trajectory is accepted and recorded.
    every = yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["log_every"]
    logged = llmtrain(*command[1:], f"train.log_every={every + 1}", cwd=tmp_path, timeout=300)
    assert logged.returncode == 0, logged.stderr[-3000:]
    (entry,) = history(run_dir)
    assert entry["trajectory_keys"] == []
    assert entry["changes"] == [
        {"key": "train.log_every", "old": every, "new": every + 1, "trajectory": False}
    ]

    # A trajectory change is refused alone, accepted with the flag, and recorded as such.
    longer = [*command[1:], "train.steps=5"]
    assert llmtrain(*longer, cwd=tmp_path, timeout=300).returncode == 2
    accepted = llmtrain(*longer, "--allow-config-change", cwd=tmp_path, timeout=300)
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    assert steps_logged(run_dir) == [1, 2, 3, 4, 5]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["steps"] == 5
    last = history(run_dir)[-1]
    assert last["accepted"] == "--allow-config-change"
    assert last["trajectory_keys"] == ["train.steps"]
    assert {"key": "train.steps", "old": 3, "new": 5, "trajectory": True} in last["changes"]
