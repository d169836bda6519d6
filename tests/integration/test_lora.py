"""finetune=lora on the real engines (CPU, gloo, in-process torch elastic on localhost:0).

One process: the frozen base weights are bitwise unchanged after training, the adapters moved,
the loss falls. FSDP2 (2 processes), tp=2, pipeline parallel 2 and DeepSpeed ZeRO-3 (2 processes):
training resumes bit for bit from an adapter-only checkpoint (no base weight in it), whose
base-weights digest refuses a different base.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_torch_engine import (
    B4,
    LLAMA,
    UNTIED,
    _rows,
    _train_and_resume,
    launch,
)

pytestmark = pytest.mark.integration

LORA = ["finetune=lora", "finetune.targets=[all-linear]", "finetune.rank=4", "optim.lr=1e-2"]


def _base_unchanged(overrides: list[str], nproc: int, steps: int, opts: dict[str, Any]) -> Any:
    """One rank: snapshot the frozen tensors, train, compare bitwise; then load a checkpoint
    saved by this engine into an engine built on another base (another seed): refused."""
    import torch
    import torch.distributed as dist

    from launcher.config.composition.compose import compose_config
    from launcher.config.layout import derive_layout
    from launcher.train.checkpoint.safe_load import CheckpointFiles
    from launcher.train.engines.dist import init_process_group_from_env
    from launcher.train.trainer import build_engine

    torch.set_num_threads(1)
    os.environ["LLMTRAIN_DEVICE"] = "cpu"
    cfg = compose_config([*overrides, f"cluster.gpus_per_node={nproc}"]).config
    init_process_group_from_env()
    try:
        engine: Any = build_engine(cfg)
        model = engine.parts[0]
        frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
        adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        lay = derive_layout(cfg)
        losses = []
        for step in range(steps):
            rows = _rows(step, lay.global_batch_size, lay.seq_length, cfg.model.vocab_size)
            losses.append(engine.step(rows, lr=cfg.optim.lr).loss)
        after = dict(model.named_parameters())
        same = all(torch.equal(after[n].detach(), t) for n, t in frozen.items())
        moved = sum(not torch.equal(after[n].detach(), t) for n, t in adapters.items())
        save_dir = Path(opts["save_dir"])
        engine.save(save_dir)
        other_cfg = compose_config(
            [*overrides, f"cluster.gpus_per_node={nproc}", "train.seed=99"]
        ).config
        other = build_engine(other_cfg)
        refused = ""
        try:
            other.load(save_dir, CheckpointFiles.unchecked(save_dir))
        except ValueError as exc:
            refused = str(exc)
        return {
            "losses": losses,
            "base_same": same,
            "frozen": len(frozen),
            "moved": moved,
            "adapters": len(adapters),
            "extra": engine.extra_state(),
            "refused": refused,
        }
    finally:
        dist.destroy_process_group()


def test_lora_keeps_the_base_bitwise_and_trains_the_adapters(tmp_path: Path) -> None:
    [r] = launch(1, [*LORA, *LLAMA], 8, _base_unchanged, save_dir=str(tmp_path / "ckpt"))
    assert r["base_same"] and r["frozen"] > 0, r
    # 2 layers x 7 projections (swiglu: q k v o gate up down) x (A, B).
    assert r["adapters"] == 2 * 7 * 2 and r["moved"] == r["adapters"], r
    assert r["losses"][-1] < r["losses"][0] - 0.1, r["losses"]
    extra = r["extra"]
    assert extra["finetune"] == "lora" and 0 < extra["params_trainable"] < extra["params_local"]
    assert "trained on base weights" in r["refused"], r["refused"]


def _dcp_keys(directory: Path) -> list[str]:
    from torch.distributed.checkpoint import FileSystemReader

    return list(FileSystemReader(str(directory)).read_metadata().state_dict_metadata)


RESUME_CASES: dict[str, tuple[int, list[str]]] = {
    "fsdp2-zero3": (2, ["zero.stage=3", *B4]),
    "tp2": (2, ["parallel.tp=2", *LLAMA, *B4]),
    "deepspeed-zero3": (2, ["backend=deepspeed", "zero.stage=3", *B4]),
    "pp2-1f1b": (2, ["parallel.pp=2", "zero.stage=0", UNTIED, *B4]),
}


@pytest.mark.parametrize("name", list(RESUME_CASES))
def test_lora_resumes_bitwise_from_an_adapter_only_checkpoint(tmp_path: Path, name: str) -> None:
    nproc, layout = RESUME_CASES[name]
    steps, save_at = 6, 3
    ckpt = tmp_path / "ckpt"
    results = launch(
        nproc, [*LORA, *layout], steps, _train_and_resume, save_at=save_at, save_dir=str(ckpt)
    )
    losses = results[0]["losses"]
    assert min(losses[1:]) < losses[0] - 0.1, losses  # learning (6 noisy steps on a random base)
    for r in results:
        assert r["losses"] == losses, "ranks disagree on the loss"
        assert r["resumed"] == r["losses"][save_at:], (r["losses"], r["resumed"])
        assert r["resumed_norms"] == r["norms"][save_at:], (r["norms"], r["resumed_norms"])
    assert (ckpt / "base_weights.json").is_file()
    if name.startswith("deepspeed"):
        import torch

        states = torch.load(
            next(ckpt.glob("engine/*model_states.pt")), weights_only=False, map_location="cpu"
        )
        module = states["module"] or {}
        assert all("lora_" in k for k in module), sorted(module)
    else:
        keys = _dcp_keys(ckpt)
        model_keys = [k for k in keys if k.startswith("model.")]
        assert model_keys and all("lora_" in k for k in model_keys), sorted(keys)
