"""DeepSpeed's pipeline engine (PipelineModule, 1F1B ``train_batch``) on CPU with gloo.

Uses the torch engine tests' harness: in-process torch elastic launch on localhost:0, the same
deterministic rows, the same tiny model (untied: the embedding and head sit on different stages).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_torch_engine import B4, UNTIED, launch

pytestmark = pytest.mark.integration

PIPE = ["backend=deepspeed", "parallel.pp=2", "zero.stage=0", UNTIED]


def test_pipeline_trains_and_matches_single_process() -> None:
    """pp=2 x dp=1, 2 micro-batches per step: the stages built from one seed are the unsplit
    model, so the losses match one process without a pipeline."""
    steps = 6
    piped = launch(2, [*PIPE, *B4], steps=steps)
    single = launch(1, ["backend=deepspeed", "zero.stage=0", UNTIED, *B4], steps=steps)
    a, b = piped[0]["losses"], single[0]["losses"]
    assert piped[1]["losses"] == a, "stages disagree on the loss"
    diff = max(abs(x - y) for x, y in zip(a, b, strict=True))
    print(f"deepspeed pp=2: max |loss - single| = {diff:.2e}")
    assert diff < 1e-4, (a, b)
    assert a[-1] < a[0] - 0.3, a
    assert piped[0]["extra"]["pipeline_stages"] == 2


def test_pipeline_resume_reproduces_losses(tmp_path: Path) -> None:
    """pp=2 with ZeRO-1 in bf16: save after 3 steps, resume in fresh processes, same losses bit
    for bit."""
    overrides = [*PIPE[:2], "zero.stage=1", "precision=bf16", UNTIED, *B4]
    ckpt = tmp_path / "ckpt"
    whole = launch(2, overrides, steps=6, save_at=3, save_dir=str(ckpt))
    assert whole[0]["losses"][-1] < whole[0]["losses"][0] - 0.3, whole[0]["losses"]
    resumed = launch(2, overrides, steps=3, first_step=3, load_dir=str(ckpt))
    for before, after in zip(whole, resumed, strict=True):
        assert after["losses"] == before["losses"][3:], (before["losses"], after["losses"])
