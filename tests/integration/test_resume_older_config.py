"""Resuming a run whose config.yaml an older llmtrain wrote (launcher.config.run_config).

An older llmtrain is simulated on a real run directory: its config.yaml is edited the way a
schema change leaves it (a section and a key this llmtrain added since are absent, a key it has
removed since is present) and the folder renamed to the hash the older llmtrain gave that
configuration. Then: `llmtrain run` refuses (exit 2, nothing started) while an unknown key that
may change training is there; the trainer, started on the run directory as a requeued SLURM job
starts it, resumes with defaults for the missing keys; and the same `llmtrain run` command finds
the older folder despite its different hash and resumes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher.launch.local import config_digest
from launcher.render.torchrun import torchrun_command
from tests.cli import llmtrain
from tests.integration.test_run import only_run_dir

pytestmark = pytest.mark.integration

SHORT = ["model.seq_length=32", "train.micro_batch_size=2", "train.global_batch_size=2"]


def steps_logged(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


def test_a_run_from_an_older_llmtrain_resumes_or_names_what_it_cannot_keep(
    tmp_path: Path,
) -> None:
    done = llmtrain("run", *SHORT, "train.steps=2", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    new_dir = only_run_dir(tmp_path)

    # What an older llmtrain would have written: no `logging` section and no train.eval_steps
    # (added since), model.dropout (removed since, planner-only) and train.foo (unknown here).
    values = yaml.safe_load((new_dir / "config.yaml").read_text())
    del values["logging"]
    del values["train"]["eval_steps"]
    values["model"]["dropout"] = True
    values["train"]["foo"] = 3
    old_dir = new_dir.with_name(f"tiny-{config_digest(values)}")
    assert old_dir != new_dir
    new_dir.rename(old_dir)
    config = old_dir / "config.yaml"
    config.write_text(yaml.safe_dump(values, sort_keys=False))
    before = config.read_text()

    # The same command finds the older folder but will not drop train.foo silently.
    refused = llmtrain("run", *SHORT, "train.steps=4", cwd=tmp_path, timeout=300)
    assert refused.returncode == 2, refused.stderr
    message = " ".join(refused.stderr.split())
    assert "train.foo=3" in message and str(config) in message
    assert "--fresh" in message and "delete it from" in message
    assert "model.dropout" not in message  # known harmless
    assert "Traceback" not in refused.stderr
    assert config.read_text() == before and steps_logged(old_dir) == [1, 2]  # nothing started
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [old_dir.name]

    # Without train.foo, the trainer itself (as a requeued job starts it) resumes the old file.
    del values["train"]["foo"]
    values["train"]["steps"] = 3
    config.write_text(yaml.safe_dump(values, sort_keys=False))
    env = {**os.environ, "LLMTRAIN_DEVICE": "cpu", "PYTHONUNBUFFERED": "1"}
    trainer = subprocess.run(
        torchrun_command(sys.executable, 1, str(old_dir)),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert trainer.returncode == 0, trainer.stderr[-3000:]
    log = (old_dir / "logs" / "rank0.log").read_text()
    assert "written by an older llmtrain: defaults for train.eval_steps, logging;" in log
    assert "dropped (harmless) model.dropout" in log
    assert "(step 2)" in log and steps_logged(old_dir) == [1, 2, 3]

    # And `llmtrain run` resumes it too (its folder name still hashes the older keys).
    resumed = llmtrain(
        "run", *SHORT, "train.steps=4", "--allow-config-change", cwd=tmp_path, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert steps_logged(old_dir) == [1, 2, 3, 4]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [old_dir.name]
    rewritten = yaml.safe_load(config.read_text())
    assert "logging" in rewritten and "dropout" not in rewritten["model"]
