"""DeepSpeed's training-time AutoTP (ds_config "tensor_parallel") on CPU with gloo.

Uses the torch engine tests' harness: in-process torch elastic launch on localhost:0, the same
deterministic rows, the same tiny model (GPT block with biases and a tied head; one case with the
Llama block and grouped-query attention). The shards of one seeded model are the unsplit model,
so the losses match one process without tensor parallel; the tolerance (1e-5) covers the changed
order of the row-parallel sums (measured: under 1e-6 over 6 steps).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_torch_engine import B4, LLAMA, _train_and_resume, launch

pytestmark = pytest.mark.integration

TOLERANCE = 1e-5


def _max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_autotp_trains_and_matches_single_process() -> None:
    """tp=2 x dp=1 with ZeRO-1: both ranks report the loss and gradient norm of one process."""
    steps = 6
    split = launch(2, ["backend=deepspeed", "parallel.tp=2", "zero.stage=1", *B4], steps=steps)
    single = launch(1, ["backend=deepspeed", "zero.stage=1", *B4], steps=steps)
    a, b = split[0]["losses"], single[0]["losses"]
    assert split[1]["losses"] == a, "tensor-parallel ranks disagree on the loss"
    assert [r["info"].tp_rank for r in split] == [0, 1]
    assert [r["info"].dp_size for r in split] == [1, 1]
    diff = _max_diff(a, b)
    norms = _max_diff(split[0]["norms"], single[0]["norms"])
    print(f"deepspeed tp=2 zero 1: max |loss - single| = {diff:.2e}, |norm - single| = {norms:.2e}")
    assert diff < TOLERANCE, (a, b)
    assert norms < 1e-4, (split[0]["norms"], single[0]["norms"])  # clipping sees the whole norm
    assert a[-1] < a[0] - 0.3, a


def test_autotp_with_data_parallel_and_zero3_matches_single_process() -> None:
    """dp=2 x tp=2 (tp innermost) with ZeRO-3, Llama block with 2 kv heads (one per tp rank)."""
    model = [*LLAMA, "model.num_kv_heads=2"]
    steps = 5
    split = launch(4, ["backend=deepspeed", "parallel.tp=2", "zero.stage=3", *model, *B4], steps)
    single = launch(1, ["backend=deepspeed", "zero.stage=0", *model, *B4], steps)
    assert [(r["info"].dp_rank, r["info"].tp_rank) for r in split] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    a = split[0]["losses"]
    assert all(r["losses"] == a for r in split), [r["losses"] for r in split]
    diff = _max_diff(a, single[0]["losses"])
    print(f"deepspeed dp=2 x tp=2 zero 3: max |loss - single| = {diff:.2e}")
    assert diff < TOLERANCE, (a, single[0]["losses"])
    assert a[-1] < a[0] - 0.3, a


def test_autotp_resume_reproduces_losses(tmp_path: Path) -> None:
    """tp=2 with ZeRO-2 in bf16, in one launch: save after 3 steps (one model file per tp rank),
    a fresh engine loaded from it reproduces steps 4-6 bit for bit."""
    overrides = ["backend=deepspeed", "parallel.tp=2", "zero.stage=2", "precision=bf16", *B4]
    whole = launch(2, overrides, 6, _train_and_resume, save_at=3, save_dir=str(tmp_path / "ckpt"))
    assert whole[0]["losses"][-1] < whole[0]["losses"][0] - 0.3, whole[0]["losses"]
    names = {Path(f).name for f in whole[0]["files"]}
    assert {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"} <= names, names
    for r in whole:
        assert r["resumed"] == r["losses"][3:], (r["losses"], r["resumed"])
