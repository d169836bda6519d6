"""Every memory saver of issue #40 trains the tiny model on the CPU in one run: pure bf16
weights, 4-bit AdamW states, the optimizer stepped in the backward, activations through the
offload hooks (launcher/backends/memory_savers.py lists what each needs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import llmtrain
from tests.integration.test_run import SHORT, losses, only_run_dir

pytestmark = pytest.mark.integration

SAVERS = [
    "precision=bf16-pure",
    "optim.name=adamw4bit",
    "optim.in_backward=true",
    "optim.grad_clip=0",
    "train.activation_offload=true",
    "train.global_batch_size=4",
    "optim.lr=3e-3",
]


def test_every_saver_trains_with_falling_loss(tmp_path: Path) -> None:
    done = llmtrain("run", *SHORT, "train.log_every=1", *SAVERS, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = losses(only_run_dir(tmp_path))
    assert len(seen) == 12
    # The byte-level tiny model starts near ln(256) = 5.55.
    assert max(seen[-3:]) < seen[0] - 0.5, seen
