"""train.recompute=selective as each backend runs it (launcher/plan/recompute.py modes): op-level
selective checkpointing on llmtrain's dense blocks, the attention core on its MoE blocks and on
Megatron-LM (its default --recompute-modules core_attn). What each keeps and runs again.

Expected values are derived by hand in the comments.
"""

from __future__ import annotations

import dataclasses

import pytest

from launcher.backends.common import recompute_mode
from launcher.config.composition.compose import compose_config
from launcher.config.schema import LLMTrainConfig
from launcher.plan.flops import config_flops
from launcher.plan.memory.estimate import layer_activation_terms
from launcher.plan.model_shape import ModelShape
from launcher.plan.planner import make_plan
from launcher.plan.recompute import extra_forwards, resolve

pytestmark = pytest.mark.unit


def cfg(*overrides: str) -> LLMTrainConfig:
    return compose_config(list(overrides)).config


def test_modes_per_backend_and_layer_kind() -> None:
    torch_cfg = cfg("recipe=llama3-8b", "backend=torch", "train.recompute=selective")
    assert recompute_mode(torch_cfg, moe=False) == "op"
    assert recompute_mode(torch_cfg, moe=True) == "core"
    ds = cfg("recipe=llama3-8b", "backend=deepspeed", "train.recompute=selective")
    assert (recompute_mode(ds, moe=False), recompute_mode(ds, moe=True)) == ("op", "core")
    meg = cfg("recipe=llama3-8b", "backend=megatron", "train.recompute=selective")
    assert (recompute_mode(meg, moe=False), recompute_mode(meg, moe=True)) == ("core", "core")
    for r in ("none", "full"):
        assert recompute_mode(cfg("recipe=llama3-8b", f"train.recompute={r}"), moe=False) == r
    # Without a backend, "selective" is op with flash attention and core with eager.
    assert resolve("selective", eager=False) == "op" and resolve("selective", eager=True) == "core"
    with pytest.raises(ValueError, match="recompute mode"):
        resolve("some", eager=False)


def test_what_each_mode_runs_again() -> None:
    # Fractions of a layer's forward, (GEMMs, attention, element-wise).
    assert extra_forwards("full", False) == extra_forwards("full", True)
    assert (extra_forwards("full", False).gemm, extra_forwards("full", False).attention) == (1, 1)
    op = extra_forwards("op", eager=False)
    assert (op.gemm, op.attention, op.elementwise) == (0.5, 0.0, 1.0)
    # Eager attention's products are not kept by the op policy: they run again.
    assert extra_forwards("op", eager=True).attention == 1.0
    core = extra_forwards("core", eager=False)
    assert (core.gemm, core.attention, core.elementwise) == (0.0, 1.0, 0.0)
    none = extra_forwards("none", eager=False)
    assert (none.gemm, none.attention, none.elementwise) == (0.0, 0.0, 0.0)


def test_core_keeps_all_but_the_log_sum_exp() -> None:
    # Llama 3 8B layer, flash: none keeps replicated 8h = 32,768 B/token and sharded
    # 2 (q 4096 + k 1024 + v 1024 + o 4096) + lse 4 x 32 + SwiGLU 8f (8 x 14336)
    # = 20,480 + 128 + 114,688 = 135,296; core the same less the 128-byte log-sum-exp.
    shape = ModelShape(cfg("recipe=llama3-8b").model)
    none = layer_activation_terms(
        shape, recompute="none", attention="flash", moe=False, dropout=False
    )
    core = layer_activation_terms(
        shape, recompute="core", attention="flash", moe=False, dropout=False
    )
    assert (none.replicated, none.sharded) == (32_768, 135_296)
    assert (core.replicated, core.sharded) == (32_768, 135_296 - 128)
    # op keeps the layer input and half of the attention / MLP outputs: 4h replicated =
    # 16,384 and 2 o + lse + (2 (q + k + v) + 4f) / 2 = 8,192 + 128 + (12,288 + 57,344) / 2
    # = 43,136 sharded, a third of core.
    op = layer_activation_terms(shape, recompute="op", attention="flash", moe=False, dropout=False)
    assert (op.replicated, op.sharded) == (16_384, 43_136)
    # Eager attention: core drops the scores (Korthikanti's selective), as "selective" did.
    eager = layer_activation_terms(
        shape, recompute="core", attention="eager", moe=False, dropout=False
    )
    assert eager == layer_activation_terms(
        shape, recompute="selective", attention="eager", moe=False, dropout=False
    )
    assert eager.scores == 0.0


def test_megatron_selective_is_priced_as_the_attention_core() -> None:
    # One node of 8 H100, Llama 3 8B, tp 8, micro-batch 1: Megatron's selective keeps what none
    # keeps less the log-sum-exp, and runs one more attention forward; torch's op mode keeps far
    # less and runs half the GEMMs again.
    base = ("recipe=llama3-8b", "cluster=h100-80gb", "cluster.num_nodes=1", "parallel.tp=8")
    meg = [
        make_plan(cfg(*base, "backend=megatron", f"train.recompute={r}"))
        for r in ("none", "selective")
    ]
    a_none, a_sel = (p.memory.stages[0].activations for p in meg)
    assert a_sel < a_none and a_sel > 0.9 * a_none
    tor = make_plan(cfg(*base, "backend=torch", "train.recompute=selective", "zero.stage=3"))
    tor_none = make_plan(cfg(*base, "backend=torch", "train.recompute=none", "zero.stage=3"))
    # (op keeps a third of a layer; the loss's logits and one recomputed layer come on top)
    assert tor.memory.stages[0].activations < 0.7 * tor_none.memory.stages[0].activations
    # Hardware FLOPs: core adds the attention forward, op half the layer GEMM forwards.
    c_meg = cfg(*base, "backend=megatron", "train.recompute=selective")
    c_none = cfg(*base, "backend=megatron", "train.recompute=none")
    c_tor = cfg(*base, "backend=torch", "train.recompute=selective")
    attn_fwd = config_flops(c_none).attention / 3.0
    assert config_flops(c_meg).recompute == pytest.approx(attn_fwd)
    assert config_flops(c_tor).recompute < config_flops(c_none).matmul / 6.0
    # The step: Megatron's selective costs one attention forward per layer more than none.
    t_none, t_sel = (p.time.compute_s for p in meg)
    assert t_sel > t_none


def test_moe_layers_of_the_torch_engine_are_priced_as_core() -> None:
    # Mixtral shape on torch with one node, ep 8: its MoE layers checkpoint the attention core
    # only, so selective keeps nearly what none keeps (unlike a dense model's op mode).
    base = (
        "recipe=mixtral-8x7b",
        "backend=torch",
        "cluster.num_nodes=1",
        "parallel.tp=1",
        "parallel.pp=1",
        "parallel.cp=1",
        "parallel.ep=8",
        "zero.stage=3",
        "model.seq_length=4096",
        "train.global_batch_size=8",
    )
    sel = make_plan(cfg(*base, "train.recompute=selective")).memory.stages[0]
    none = make_plan(cfg(*base, "train.recompute=none")).memory.stages[0]
    assert 0.9 * none.activations < sel.activations < none.activations
    assert dataclasses.astuple(sel) != dataclasses.astuple(none)
