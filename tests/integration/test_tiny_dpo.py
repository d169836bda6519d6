"""recipe=tiny-dpo-lora trains on the CPU with the reward accuracy rising: a base
(recipe=tiny-llama, a few steps), then DPO with LoRA on the built-in preference pairs, the
reference being the same model with its adapters off (step 1: loss ln 2, accuracy 0).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.cli import llmtrain

pytestmark = pytest.mark.integration

BASE = ["model.seq_length=32", "train.micro_batch_size=2", "train.global_batch_size=2"]
STEPS = 24


def test_tiny_dpo_reward_accuracy_rises(tmp_path: Path) -> None:
    base = llmtrain("run", "recipe=tiny-llama", "train.steps=2", *BASE, cwd=tmp_path)
    assert base.returncode == 0, base.stderr[-3000:]
    dpo = llmtrain(
        "run", "recipe=tiny-dpo-lora", "train.init_from=runs/tiny-llama", f"train.steps={STEPS}",
        "train.log_every=6", cwd=tmp_path,
    )  # fmt: skip
    assert dpo.returncode == 0, dpo.stderr[-3000:]
    run = tmp_path / "runs" / "tiny-dpo-lora"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first = records[0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert first["rewards/accuracy"] == 0.0 and first["rewards/margin"] == pytest.approx(0.0)
    # From 0 at step 1 to about half or more of each step's new pairs (measured: 50-62% at steps
    # 10-60 on a 20-step base), with a positive margin.
    later = records[STEPS // 2 :]
    accuracy = sum(r["rewards/accuracy"] for r in later) / len(later)
    assert accuracy > 0.4, [r["rewards/accuracy"] for r in records]
    assert sum(r["rewards/margin"] for r in later) > 0
    assert "acc " in dpo.stdout and "margin " in dpo.stdout  # the progress line
