"""Packed rows' attention kernel: stated by plan (engine choices), priced by
launcher/plan/timing/packed_rows.py, refused where flex_attention cannot train."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.backends import raw_refusals
from launcher.backends.engine_choices import engine_choices
from launcher.config.composition.compose import compose_config
from launcher.config.schema import LLMTrainConfig
from launcher.plan.planner import make_plan
from launcher.plan.timing.packed_rows import FLEX_RATE_VS_FA2, packed_attention_s

pytestmark = pytest.mark.unit

# The shape of bench/results/h200-2026-11-27/sft_attention.txt: 4 layers, h 2048, 16 heads over
# 8 kv heads, 2 rows of 8,192 tokens, bf16, eager.
BENCH = [
    "cluster=h200", "cluster.num_nodes=1", "cluster.gpus_per_node=1", "precision=bf16",
    "model.num_layers=4", "model.hidden_size=2048", "model.ffn_hidden_size=8192",
    "model.num_attention_heads=16", "model.num_kv_heads=8", "model.vocab_size=32000",
    "model.seq_length=8192", "model.position=rope", "model.norm=rmsnorm",
    "model.activation=swiglu", "model.tie_embeddings=false", "train.micro_batch_size=2",
    "train.global_batch_size=2", "backend.compile=false",
]  # fmt: skip
CHAT = [*BENCH, "data.builtin=chat"]


def cfg(*overrides: str) -> LLMTrainConfig:
    return compose_config(list(overrides)).config


def test_plan_states_the_kernel_of_packed_rows() -> None:
    gpu = engine_choices(cfg(*CHAT))
    assert gpu.packed_attention == "flex" and "flex document mask" in gpu.summary()
    assert "BlockMask" in gpu.lines()[-1] and "auto on a GPU" in gpu.lines()[-1]
    cpu = engine_choices(cfg("data.builtin=chat"))
    assert cpu.packed_attention == "sdpa" and "on the CPU" in cpu.packed_why
    asked = engine_choices(cfg(*CHAT, "model.packed_attention=sdpa"))
    assert asked.packed_attention == "sdpa" and "[b, 1, s, s]" in asked.lines()[-1]
    assert engine_choices(cfg(*CHAT, "data.packing=false")).packed_attention is None
    assert engine_choices(cfg(*BENCH)).packed_attention is None  # pre-training rows


def test_the_dense_mask_is_priced_as_measured_on_an_h200() -> None:
    # Measured: 122.8 ms with the mask against 86.5 ms is_causal (1.42x).
    causal = make_plan(cfg(*BENCH)).time.step_s
    dense = make_plan(cfg(*CHAT, "model.packed_attention=sdpa")).time.step_s
    flex = make_plan(cfg(*CHAT)).time.step_s
    assert 1.42 * 0.9 < dense / causal < 1.42 * 1.1
    # flex: the causal square at FlexAttention's H100 rates over FA2 (forward 1.25, backward 1.03).
    assert causal * 0.9 < flex < causal


def test_the_formula_term_by_term() -> None:
    causal = (1.0, 2.5)
    f, b = FLEX_RATE_VS_FA2["ampere"]
    assert packed_attention_s("flex", causal, "ampere", 0, 2, 1e12) == (1.0 / f, 2.5 / b)
    # sdpa: twice the FLOPs, plus 1e12 mask elements of 2 bytes at 2e12 B/s (1 s) each pass.
    assert packed_attention_s("sdpa", causal, "hopper", 1e12, 2, 2e12) == (3.0, 6.0)


def test_flex_is_refused_where_it_cannot_train() -> None:
    def refusals(*overrides: str) -> list[str]:
        return [r.message for r in raw_refusals("torch", cfg(*overrides))]

    assert any("no backward on the CPU" in m for m in refusals("model.packed_attention=flex"))
    dropout = refusals(*CHAT, "model.packed_attention=flex", "model.attention_dropout=0.1")
    assert any("flex_attention has no dropout" in m for m in dropout)
    assert not any("packed_attention" in m for m in refusals(*CHAT, "model.packed_attention=flex"))


def test_a_prepared_chat_folder_is_packed(tmp_path: Path) -> None:
    for layout, kernel in (("chat", "flex"), ("shards", None)):
        folder = tmp_path / layout
        folder.mkdir()
        (folder / "index.json").write_text(json.dumps({"layout": layout}))
        found = engine_choices(cfg(*BENCH, f"data.path={folder}")).packed_attention
        assert found == kernel, layout
