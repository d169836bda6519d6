"""recipes/tiny-sft trains on the CPU with a falling masked loss (the built-in chat dataset,
prepared on first use), and its metrics count trained tokens beside processed ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import llmtrain

pytestmark = pytest.mark.integration


def test_tiny_sft_masked_loss_falls(tmp_path: Path) -> None:
    done = llmtrain(
        "run", "recipe=tiny-sft", "train.steps=16", "model.seq_length=128",
        f"run.root_dir={tmp_path / 'runs'}", "run.name=sft",
        env={"LLMTRAIN_CACHE": str(tmp_path / "cache")}, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "chat data:" in done.stdout and "(packed)" in done.stdout
    run = tmp_path / "runs" / "sft"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["last_loss"] < 0.6 * summary["first_loss"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    processed = last["tokens"]
    assert 0 < last["trained_tokens_total"] < processed / 2  # assistant tokens only
