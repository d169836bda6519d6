"""The ds_config's AutoTP partition rules name exactly the projections of llmtrain's model that
tensor parallel must split (launcher/render/ds_config.py, launcher/train/model/transformer.py)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from torch import nn

from launcher.config.composition.compose import compose_config
from launcher.render.ds_config import AUTOTP_COLUMN, AUTOTP_ROW, ds_config
from launcher.train.model.transformer import build_model

pytestmark = pytest.mark.unit


def _kind(name: str) -> str:
    column = any(re.match(p, name) for p in AUTOTP_COLUMN)
    row = any(re.match(p, name) for p in AUTOTP_ROW)
    assert not (column and row), name
    return "column" if column else "row" if row else "replicated"


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # GPT block: GELU MLP, biases, tied head
        ["model.activation=swiglu", "model.norm=rmsnorm", "model.num_kv_heads=2"],
    ],
)
def test_every_projection_of_the_model_is_split_and_nothing_else(overrides: list[str]) -> None:
    cfg = compose_config(["recipe=tiny", "model.tie_embeddings=false", *overrides]).config
    model = build_model(dataclasses.replace(cfg.model, num_layers=2), device="cpu", seed=0)
    seen: dict[str, set[str]] = {"column": set(), "row": set(), "replicated": set()}
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}"
            leaf = module_name.rsplit(".", 1)[-1]
            seen[_kind(full)].add(leaf if isinstance(module, nn.Linear) else type(module).__name__)
    mlp_in = {"w1", "w3"} if "model.activation=swiglu" in overrides else {"w1"}
    assert seen["column"] == {"wq", "wk", "wv"} | mlp_in
    assert seen["row"] == {"wo", "w2"}
    assert "output" in seen["replicated"] and not {"wq", "wo", "w1", "w2"} & seen["replicated"]


def test_the_tensor_parallel_block_is_rendered_with_tp_only() -> None:
    tp2 = ds_config(compose_config(["backend=deepspeed", "parallel.tp=2"]).config)
    block = tp2["tensor_parallel"]
    assert block["autotp_size"] == 2
    assert block["partition_config"]["use_default_specs"] is False
    assert "tensor_parallel" not in ds_config(compose_config(["backend=deepspeed"]).config)


def test_plan_prices_the_replicated_head_on_every_tp_rank() -> None:
    # The partition rules leave the embedding and the output layer whole (test above), so each
    # tp rank holds both and computes the full logits with the eager loss. tiny, untied, tp 2
    # on 2 CPU processes: the embeddings and the output layer whole on the rank (half each
    # under torch, which splits them); logits of a micro-batch x 256 tokens x vocab 256 x 12
    # bytes (the eager loss's backward) whole, against 16 bytes / tp 2 = 8 under torch.
    from launcher.backends.common import backend_of
    from launcher.config.layout import derive_layout
    from launcher.plan.memory.estimate import logits_bytes, stage_params
    from launcher.plan.model_shape import ModelShape

    base = ["recipe=tiny", "model.tie_embeddings=false", "cluster.gpus_per_node=2"]
    ds = compose_config([*base, "backend=deepspeed", "parallel.tp=2"]).config
    tt = compose_config([*base, "backend=torch", "parallel.tp=2"]).config
    assert not backend_of(ds).tp_splits_vocab and backend_of(tt).tp_splits_vocab
    m = ds.model
    shape = ModelShape(m)
    # hidden 128: tok 256 x 128 + learned positions 256 x 128 = 65,536; the output layer
    # 32,768 + the final LayerNorm's 256 = 33,024.
    ends = shape.embedding_params() + shape.output_params()
    assert ends == 65_536 + 33_024
    layers = shape.dense_layer_params() * m.num_layers / 2
    assert stage_params(ds, derive_layout(ds), 0).dense == pytest.approx(layers + ends)
    assert stage_params(tt, derive_layout(tt), 0).dense == pytest.approx(layers + ends / 2)
    tokens = derive_layout(ds).micro_batch_size * m.seq_length
    assert logits_bytes(ds, derive_layout(ds)) == tokens * m.vocab_size * 12
    assert logits_bytes(tt, derive_layout(tt)) == tokens * m.vocab_size * 16 / 2
