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


# Each rank's chunks as plain modules, each chunk under FSDP2 (DTensor shards over dp=1), and
# LoRA adapters on a frozen base (the checkpoint holds the adapters and their optimizer state
# only: torch_state.TRAINABLE_OPTIONS). finetune.name rather than the finetune=lora group, which
# sets pp=1.
VARIANTS = {
    "plain": [],
    "fsdp2": ["zero.stage=3"],
    "lora": ["finetune.name=lora", "finetune.rank=4", "finetune.targets=[all-linear]"],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_interleaved_pipeline_resumes_bitwise_with_the_models_names(
    tmp_path: Path, variant: str
) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    from launcher.config.composition.compose import compose_config
    from launcher.train.checkpoint.safe_load import CheckpointFiles
    from launcher.train.model.transformer import build_model
    from tests.checkpoint_reference import full_state

    steps, save_at, ckpt = 4, 2, tmp_path / "ckpt"
    layout = [*INTERLEAVED, *VARIANTS[variant]]
    results = launch(2, layout, steps, _train_and_resume, save_at=save_at, save_dir=str(ckpt))
    for r in results:
        assert r["extra"]["pp_schedule"] == "interleaved" and len(r["extra"]["chunks"]) == 2
        assert r["extra"]["data_parallel"] == ("fsdp2" if variant == "fsdp2" else "none")
        assert r["resumed"] == r["losses"][save_at:], (r["losses"], r["resumed"])
        assert _same(r["resumed_norms"], r["norms"][save_at:]), (r["norms"], r["resumed_norms"])

    # The checkpoint names every tensor as the unsplit model does (what consolidation and export
    # read), the optimizer's flattened state included: no chunk index anywhere.
    cfg = compose_config([*TINY, *layout, "cluster.gpus_per_node=2"]).config
    whole = {k: tuple(v.shape) for k, v in build_model(cfg.model, "meta").state_dict().items()}
    keys = FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    saved = {k.removeprefix("model.") for k in keys if k.startswith("model.")}
    if variant == "lora":  # the adapters of every layer, both ranks' chunks, under their names
        assert all(".lora_a." in k or ".lora_b." in k for k in saved), sorted(saved)
        assert {k.split(".")[1] for k in saved} == {"0", "1", "2", "3"}, sorted(saved)
        assert {k.rsplit(".lora_", 1)[0] + ".weight" for k in saved} <= set(whole)
    else:
        state = full_state(ckpt, cfg.model.num_layers, CheckpointFiles.unchecked(ckpt))
        assert {k: tuple(v.shape) for k, v in state.items()} == whole
        assert saved == set(whole)
    moments = {k.removeprefix("optim.state.") for k in keys if k.startswith("optim.state.")}
    assert moments == {f"{name}.{m}" for name in saved for m in ("step", "exp_avg", "exp_avg_sq")}


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
