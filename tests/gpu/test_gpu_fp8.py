"""precision=fp8 with real fp8 matmuls (torchao float8, torch._scaled_mm) on one CUDA GPU of
compute capability 8.9+ (L40S, H100, H200, B200): skipped cleanly elsewhere (CI has no GPU).

On a GPU machine: `python -m pytest -m gpu tests/gpu/test_gpu_fp8.py`.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.cli import llmtrain

torch = pytest.importorskip("torch")
if importlib.util.find_spec("torchao") is None:  # found, not imported (~1.5 CPU s) at collection
    pytest.skip("torchao is not installed", allow_module_level=True)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_small_llama_trains_with_real_fp8_on_one_gpu(tmp_path: Path) -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("real fp8 matmuls need compute capability 8.9+")
    overrides = [
        "recipe=llama3-1b",
        "cluster=h100-80gb",
        "cluster.num_nodes=1",
        "cluster.gpus_per_node=1",
        "model.num_layers=4",
        "model.seq_length=1024",
        "train.micro_batch_size=2",
        "train.global_batch_size=4",
        "train.steps=20",
        "parallel.tp=1",
        "parallel.pp=1",
        "zero.stage=0",
        "backend=torch",
        "precision=fp8",
        "train.recompute=none",
    ]
    done = llmtrain("run", "--force", *overrides, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Failed to load" not in done.stdout + done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["last_loss"] < summary["first_loss"] - 0.5, summary
