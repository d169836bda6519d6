"""DeepSpeed's pipeline engine (PipelineModule, 1F1B ``train_batch``) on CPU with gloo.

Uses the torch engine tests' harness: in-process torch elastic launch on localhost:0, the same
deterministic rows, the same tiny model (untied: the embedding and head sit on different stages).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_torch_engine import B4, UNTIED, _train_and_resume, launch

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
    """pp=2 with ZeRO-1 in bf16, in one launch: the loss falls over 6 steps saving after 3, and a
    fresh engine loaded from that checkpoint reproduces steps 4-6 bit for bit."""
    overrides = [*PIPE[:2], "zero.stage=1", "precision=bf16", UNTIED, *B4]
    results = launch(2, overrides, 6, _train_and_resume, save_at=3, save_dir=str(tmp_path / "ckpt"))
    losses = results[0]["losses"]
    assert losses[-1] < losses[0] - 0.3, losses
    for r in results:
        assert r["resumed"] == r["losses"][3:], (r["losses"], r["resumed"])
        assert r["files"] and all(Path(f).is_file() for f in r["files"]), r["files"]
        assert r["loaded_extra"] == r["saved_extra"] == {"zero_stage": 1, "pipeline_stages": 2}
