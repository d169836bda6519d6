"""An interleaved pipeline (several model chunks per rank, one optimizer over them) checkpoints,
resumes bitwise, and its checkpoint holds the model's own parameter names.

Two gloo ranks, pp=2 x vpp=2: rank 0 holds chunks 0 and 2, rank 1 chunks 1 and 3. One launch
(``_train_and_resume`` of test_torch_engine) trains 4 steps saving after step 2, then a fresh
engine loads that checkpoint and runs steps 3-4 again: their losses and gradient norms must equal
the uninterrupted run's bit for bit (CPU is deterministic), so every chunk's weights and the
optimizer state of every chunk came back. A second test does the same through `llmtrain run`
(checkpoint files, manifest, resume after the run is cut back).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_torch_engine import (
    B4,
    TINY,
    UNTIED,
    _same,
    _train_and_resume,
    launch,
)

pytestmark = pytest.mark.integration

INTERLEAVED = [
    "parallel.pp=2",
    "parallel.vpp=2",
    "parallel.pp_schedule=interleaved",
    "model.num_layers=4",
    UNTIED,
    *B4,
]


# Each rank's chunks as plain modules, and each chunk under FSDP2 (DTensor shards over dp=1).
SHARDING = {"plain": [], "fsdp2": ["zero.stage=3"]}


@pytest.mark.parametrize("sharding", list(SHARDING))
def test_interleaved_pipeline_resumes_bitwise_with_the_models_names(
    tmp_path: Path, sharding: str
) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    from launcher.config.compose import compose_config
    from launcher.train.consolidate import full_state
    from launcher.train.model import build_model
    from launcher.train.safe_load import CheckpointFiles

    steps, save_at, ckpt = 4, 2, tmp_path / "ckpt"
    layout = [*INTERLEAVED, *SHARDING[sharding]]
    results = launch(2, layout, steps, _train_and_resume, save_at=save_at, save_dir=str(ckpt))
    for r in results:
        assert r["extra"]["pp_schedule"] == "interleaved" and len(r["extra"]["chunks"]) == 2
        assert r["extra"]["data_parallel"] == ("fsdp2" if sharding == "fsdp2" else "none")
        assert r["resumed"] == r["losses"][save_at:], (r["losses"], r["resumed"])
        assert _same(r["resumed_norms"], r["norms"][save_at:]), (r["norms"], r["resumed_norms"])

    # The checkpoint names every tensor as the unsplit model does (what consolidation and export
    # read), the optimizer's flattened state included: no chunk index anywhere.
    cfg = compose_config([*TINY, *layout, "cluster.gpus_per_node=2"]).config
    whole = build_model(cfg.model, "meta").state_dict()
    state = full_state(ckpt, cfg.model.num_layers, CheckpointFiles.unchecked(ckpt))
    assert {k: tuple(v.shape) for k, v in state.items()} == {
        k: tuple(v.shape) for k, v in whole.items()
    }
    keys = FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    moments = {k.removeprefix("optim.state.") for k in keys if k.startswith("optim.state.")}
    assert moments == {f"{name}.{m}" for name in whole for m in ("step", "exp_avg", "exp_avg_sq")}


def test_interleaved_pipeline_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """The same through `llmtrain run` (the command that crashed at its first checkpoint): two
    processes train 12 steps checkpointing every 4, the run is cut back to step 8 and resumed,
    and steps 9-12 log the uninterrupted losses exactly (test_run.resume_matches)."""
    from tests.integration.test_run import resume_matches

    run_dir = resume_matches(
        tmp_path,
        [
            "cluster.gpus_per_node=2",
            "backend=torch",
            "parallel.pp=2",
            "parallel.vpp=2",
            "parallel.pp_schedule=interleaved",
            UNTIED,
        ],
    )
    assert (run_dir / "checkpoints" / "step_00000012" / "engine" / ".metadata").is_file()
