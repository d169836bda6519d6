"""Lion and SGD train under the real engines (torch single process, DeepSpeed ZeRO-1 over two gloo
processes, where DeepSpeed needs zero_allow_untested_optimizer for them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import llmtrain
from tests.integration.test_run import SHORT, losses, only_run_dir

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("optimizer", "extra"),
    [
        ("lion", ["optim.lr=3e-4"]),
        ("sgd", ["optim.lr=0.3", "backend=deepspeed", "zero.stage=1", "cluster.gpus_per_node=2"]),
    ],
)
def test_optimizer_trains(tmp_path: Path, optimizer: str, extra: list[str]) -> None:
    done = llmtrain(
        "run", *SHORT, "train.log_every=1", f"optim.name={optimizer}", *extra, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = losses(only_run_dir(tmp_path))
    assert len(seen) == 12
    # The byte-level tiny model starts near ln(256) = 5.55; both optimizers must bring it down.
    assert max(seen[-3:]) < seen[0] - 0.5, seen
