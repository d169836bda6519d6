"""One writer per run directory even when its lock file is deleted under a live run (issue 19,
item 3), with real `llmtrain run` processes (torchrun, one gloo CPU rank each, tiny model).

The reproduction: the lock file deleted during a run let a second run in, and both wrote
step_00000050. Now the first run's ranks check the lock's identity (inode and token) before each
checkpoint: gone, the run stops with that error before writing, and the second run alone writes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.cli import start
from tests.faults import llmtrain_run

pytestmark = pytest.mark.integration

ARGS = [
    "model.seq_length=32",
    "train.micro_batch_size=4",
    "optim.warmup_steps=1",
    "cluster.gpus_per_node=1",
    "checkpoint.every_steps=5",
    "run.name=one-writer",
]


def test_a_deleted_lock_file_stops_its_holder_before_its_next_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "one-writer"
    first = start("run", *ARGS, "train.steps=100000", cwd=tmp_path)
    try:
        deadline = time.monotonic() + 180
        while not (run_dir / "checkpoints" / "step_00000005").is_dir():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first run wrote no checkpoint"
            time.sleep(0.05)
        (run_dir / ".llmtrain.lock").unlink()  # a careless `rm` while it runs
        second = llmtrain_run(
            tmp_path, [*ARGS, "train.steps=12", "--allow-config-change"], timeout=300
        )
        assert second.returncode == 0, second.stderr[-3000:]
        # The first run stopped at its next checkpoint, at the latest: it never got to write
        # alongside the second one.
        _, stderr = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 1, stderr[-3000:]
    assert "lock" in stderr and "was deleted while this run held it" in stderr
    assert "stops before writing checkpoint step" in stderr
    rank0 = (run_dir / "logs" / "rank0.log").read_text()
    assert "done: 12 steps" in rank0 or (run_dir / "summary.json").is_file()
    assert (run_dir / "checkpoints" / "step_00000012").is_dir()
