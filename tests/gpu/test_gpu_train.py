"""Training on a CUDA GPU: skipped cleanly on machines without one (CI has none).

On a GPU machine: `python -m pytest -m gpu tests/gpu`. The run's measured peak memory (torch's
max allocated) is compared with `plan`'s prediction for the same config.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cli import llmtrain

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_llama_style_model_trains_in_bf16_on_one_gpu(tmp_path: Path) -> None:
    # A ~125M Llama-shaped model: big enough for the allocator figures to mean something.
    overrides = [
        "recipe=llama3-1b",
        "cluster=h100-80gb",
        "cluster.num_nodes=1",
        "cluster.gpus_per_node=1",
        "model.num_layers=4",
        "model.seq_length=2048",
        "train.micro_batch_size=2",
        "train.global_batch_size=4",
        "train.steps=20",
        "parallel.tp=1",
        "parallel.pp=1",
        "zero.stage=0",
        "backend=torch",
        "train.recompute=none",
    ]
    done = llmtrain("run", "--force", *overrides, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["last_loss"] < summary["first_loss"]
    measured = summary["measured_peak_memory"]["max_allocated"]
    predicted = summary["predicted_memory_allocated_bytes"]
    assert 0.5 < measured / predicted < 1.5, (measured, predicted)
    shutil.rmtree(run_dir)
