"""The masked loss is the mean over every trained token of the global batch, whatever the split
into micro-batches and data-parallel ranks, on real engines (torch DDP and DeepSpeed ZeRO-1 over
gloo): losses and the weights after an update agree with one process taking the whole batch,
with rows whose trained-token counts differ tenfold and examples packed two to a row."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.elastic import run_ranks

pytestmark = pytest.mark.integration

BASE = [
    "recipe=tiny-sft",
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.ffn_hidden_size=128",
    "model.seq_length=32",
    "train.global_batch_size=4",
    "optim.lr=1e-2",
    "optim.warmup_steps=0",
]


def _chat_rows(step: int, seq: int) -> Any:
    """4 chat rows [4, 3, seq + 1]: two packed examples each, very unequal trained counts."""
    import torch

    g = torch.Generator().manual_seed(step)
    rows = torch.zeros(4, 3, seq + 1, dtype=torch.int64)
    rows[:, 0] = torch.randint(0, 200, (4, seq + 1), generator=g)
    split = 12
    rows[:, 2, :split], rows[:, 2, split:] = 1, 2
    for r, trained in enumerate((2, 20, 5, 30)):
        picks = torch.randperm(seq, generator=g)[:trained] + 1
        rows[r, 1, picks] = 1
    rows[:, 1, split] = 0  # an example's first token is never a target
    return rows


def _train(overrides: list[str], nproc: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from launcher.config.composition.compose import compose_config
    from launcher.config.layout import derive_layout
    from launcher.train.engines.dist import init_process_group_from_env
    from launcher.train.trainer import build_engine

    torch.set_num_threads(1)
    os.environ["LLMTRAIN_DEVICE"] = "cpu"
    os.environ["DS_ACCELERATOR"] = "cpu"
    cfg = compose_config([*BASE, *overrides, f"cluster.gpus_per_node={nproc}"]).config
    init_process_group_from_env()
    try:
        engine = build_engine(cfg)
        lay = derive_layout(cfg)
        per_dp = lay.grad_accum * lay.micro_batch_size
        losses, trained = [], []
        for step in range(2):
            rows = _chat_rows(step, lay.seq_length)
            mine = rows[engine.info.dp_rank * per_dp : (engine.info.dp_rank + 1) * per_dp]
            result = engine.step(mine, lr=cfg.optim.lr)
            losses.append(result.loss)
            trained.append(result.trained_tokens)
        val = engine.evaluate(
            _chat_rows(7, lay.seq_length)[
                engine.info.dp_rank * per_dp : (engine.info.dp_rank + 1) * per_dp
            ]
        )
        engine.close()
        return {"losses": losses, "trained": trained, "val": val}
    finally:
        dist.destroy_process_group()


def test_global_token_mean_over_micro_batches_and_ranks() -> None:
    whole = run_ranks(1, _train, ["train.micro_batch_size=4"], 1)[0]
    assert whole["trained"] == [int(_chat_rows(s, 32)[:, 1, 1:].sum()) for s in range(2)]
    accum = run_ranks(1, _train, ["train.micro_batch_size=1"], 1)[0]
    ddp = run_ranks(2, _train, ["train.micro_batch_size=1"], 2)
    ds = run_ranks(2, _train, ["train.micro_batch_size=2", "backend=deepspeed", "zero.stage=1"], 2)
    for other in (accum, *ddp, *ds):
        assert other["trained"] == whole["trained"]
        assert other["losses"] == pytest.approx(whole["losses"], rel=1e-5)
        assert other["val"] == pytest.approx(whole["val"], rel=1e-5)


def _train_padded(overrides: list[str], nproc: int) -> dict[str, Any]:
    """As _train, on padded rows (one example a row: no document mask, as pipelines need)."""
    global _chat_rows
    packed = _chat_rows

    def padded(step: int, seq: int) -> Any:
        rows = packed(step, seq)
        rows[:, 2] = 0
        return rows

    _chat_rows = padded
    try:
        return _train(overrides, nproc)
    finally:
        _chat_rows = packed


def test_pipeline_last_stage_masked_loss() -> None:
    """The loss computed on the last pipeline stage (torch's 1F1B, DeepSpeed's PipelineModule)
    is the same global token mean as one process without a pipeline."""
    common = ["model.tie_embeddings=false", "data.packing=false"]
    whole = run_ranks(1, _train_padded, ["train.micro_batch_size=4", *common], 1)[0]
    pipelines = [
        *run_ranks(2, _train_padded, ["train.micro_batch_size=2", "parallel.pp=2", *common], 2),
        *run_ranks(
            2,
            _train_padded,
            ["train.micro_batch_size=2", "parallel.pp=2", "backend=deepspeed", *common],
            2,
        ),
    ]
    for other in pipelines:
        assert other["trained"] == whole["trained"]
        assert other["losses"] == pytest.approx(whole["losses"], rel=1e-5)
        assert other["val"] == pytest.approx(whole["val"], rel=1e-5)
