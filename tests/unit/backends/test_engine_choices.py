"""What the engine runs, decided in one place (launcher.backends.engine_choices) and stated by
`plan`: compile default per backend/precision, fp8 recipe and layers, chunked loss; the refusals
that keep an explicit setting from being silently ignored."""

from __future__ import annotations

import json

import pytest

from launcher.backends import raw_refusals
from launcher.backends.engine_choices import (
    block_projections,
    engine_choices,
    fp8_converts,
    fp8_gemm_gains,
)
from launcher.config.composition.compose import compose_config
from launcher.config.schema import LLMTrainConfig
from tests.cli import invoke

pytestmark = pytest.mark.unit

H100 = ["cluster=h100-80gb", "cluster.gpus_per_node=1", "cluster.num_nodes=1"]


def cfg(*overrides: str) -> LLMTrainConfig:
    return compose_config(list(overrides)).config


def messages(backend: str, *overrides: str) -> list[str]:
    return [r.message for r in raw_refusals(backend, cfg(*overrides))]


def test_compile_defaults() -> None:
    # A dense run on a GPU compiles from COMPILE_MIN_STEPS (1,000) steps: the measured compile
    # time (10.7 s) pays back after ~375 steps of the 28.6 ms saved (228.7 - 200.1 ms).
    long = engine_choices(cfg("recipe=llama3-1b", "train.steps=1000", *H100))
    assert long.compile and "200.1 ms" in long.compile_why and "375 steps" in long.compile_why
    short = engine_choices(cfg("recipe=llama3-1b", "train.steps=999", *H100))
    assert not short.compile and "under 1,000 steps" in short.compile_why
    moe = engine_choices(cfg("recipe=mixtral-8x7b", "backend=torch", "train.steps=5000", *H100))
    assert not moe.compile and "MoE" in moe.compile_why
    assert not engine_choices(cfg("recipe=tiny", "train.steps=5000")).compile  # the CPU
    fp8 = engine_choices(cfg("recipe=llama3-1b", "precision=fp8", *H100))
    assert fp8.compile and "precision=fp8" in fp8.compile_why
    emulated = engine_choices(cfg("recipe=tiny", "precision=fp8", "precision.fp8_emulate=true"))
    assert not emulated.compile  # numerics check on CPU: nothing to gain from compiling
    explicit = engine_choices(cfg("recipe=tiny", "backend.compile=true"))
    assert explicit.compile and explicit.compile_why == "backend.compile=true"
    assert not engine_choices(cfg("recipe=tiny", "backend=deepspeed")).compile


def test_fp8_with_compile_explicitly_off_is_refused_with_the_measurement() -> None:
    (found,) = messages(
        "torch", "recipe=llama3-1b", "precision=fp8", "backend.compile=false", *H100
    )
    assert "470 ms" in found and "240 ms" in found and "backend.compile" in found, found
    assert messages("torch", "recipe=llama3-1b", "precision=fp8", *H100) == []
    # Emulated fp8 (CPU numerics) may run eager.
    assert (
        messages(
            "torch",
            "recipe=tiny",
            "precision=fp8",
            "precision.fp8_emulate=true",
            "backend.compile=false",
        )
        == []
    )


def test_deepspeed_refuses_compile_it_would_ignore() -> None:
    (found,) = messages("deepspeed", "recipe=tiny", "backend=deepspeed", "backend.compile=true")
    assert "backend.compile=true" in found and "eager" in found, found
    assert messages("deepspeed", "recipe=tiny", "backend=deepspeed") == []


def test_fp8_size_rule_is_torchaos() -> None:
    # torchao 0.18 _auto_filter_for_tensorwise / _auto_filter_for_rowwise thresholds.
    assert not fp8_gemm_gains(1024, 4096, "tensorwise")  # K <= 4096 and N <= 1024
    assert fp8_gemm_gains(1024, 8192, "tensorwise")
    assert fp8_gemm_gains(2048, 2048, "tensorwise")
    assert not fp8_gemm_gains(2048, 8192, "rowwise")  # N <= 2048
    assert not fp8_gemm_gains(4096, 2048, "rowwise")  # N <= 4096 and K <= 2048
    assert fp8_gemm_gains(8192, 2048, "rowwise")
    assert not fp8_gemm_gains(8200, 8200, "tensorwise")  # not a multiple of 16
    assert fp8_converts(64, 32, "tensorwise", emulate=True)  # emulated: every aligned layer


def test_fp8_layers_for_llama_shapes() -> None:
    one_b = engine_choices(cfg("recipe=llama3-1b", "precision=fp8", *H100))
    assert one_b.fp8_recipe == "tensorwise"
    assert one_b.fp8_layers == ("wq", "wo", "w1", "w2", "w3") and one_b.bf16_layers == ("wk", "wv")
    rowwise = engine_choices(
        cfg("recipe=llama3-1b", "precision=fp8", "precision.fp8_recipe=rowwise", *H100)
    )
    # rowwise gains on larger GEMMs only: N = 2048 (wq, wo, w2) and N = 512 (wk, wv) stay bf16.
    assert rowwise.fp8_layers == ("w1", "w3")
    eight_b = engine_choices(cfg("recipe=llama3-8b", "precision=fp8", *H100))
    assert eight_b.bf16_layers == ("wk", "wv")  # N = 1024, K = 4096
    names = [n for n, _, _ in block_projections(cfg("recipe=llama3-8b").model)]
    assert names == ["wq", "wk", "wv", "wo", "w1", "w2", "w3"]


def test_chunked_loss_where_it_applies() -> None:
    assert engine_choices(cfg("recipe=tiny")).chunked_loss
    assert not engine_choices(cfg("recipe=tiny", "train.chunked_loss=false")).chunked_loss
    tp = engine_choices(cfg("recipe=tiny", "parallel.tp=2", "cluster.gpus_per_node=2"))
    assert not tp.chunked_loss and "tp" in tp.loss_why
    # Under tp the torch engine's loss is vocabulary-parallel (torch loss_parallel), as the plan's
    # memory prices it (memory.LOSS_PARALLEL_BACKWARD_BYTES); DeepSpeed's AutoTP is not.
    assert tp.vocab_parallel_loss and "vocab-parallel loss" in tp.summary()
    assert not engine_choices(cfg("recipe=tiny")).vocab_parallel_loss
    ds = cfg("recipe=tiny", "parallel.tp=2", "cluster.gpus_per_node=2", "backend=deepspeed")
    assert not engine_choices(ds).vocab_parallel_loss
    (found,) = messages(
        "torch",
        "recipe=tiny",
        "parallel.tp=2",
        "cluster.gpus_per_node=2",
        "train.chunked_loss=true",
    )
    assert "train.chunked_loss=true" in found and "parallel.tp=1" in found, found


def test_plan_states_and_prices_the_choices() -> None:
    args = ["plan", "recipe=llama3-1b", "precision=fp8", *H100, "--json"]
    doc = json.loads(invoke(*args).stdout)
    engine = doc["engine"]
    assert engine["compile"] and engine["fp8_recipe"] == "tensorwise"
    assert engine["bf16_layers"] == ["wk", "wv"] and engine["chunked_loss"]
    shown = invoke("plan", "recipe=llama3-1b", "precision=fp8", *H100).stdout
    assert "engine: compiled per block, fp8 tensorwise on 5/7 block GEMMs, chunked loss" in shown
    detail = invoke("plan", "recipe=llama3-1b", "precision=fp8", *H100, "--detail").stdout
    assert "compile: per transformer block" in detail and "loss: chunked" in detail
    # The chunked loss keeps less than the full logits (10 bytes a logit for 8192 x 128k).
    full = json.loads(invoke(*args, "train.chunked_loss=false").stdout)["memory"][
        "activations_bytes"
    ]
    assert doc["memory"]["activations_bytes"] < full - 5e9


def test_compiled_blocks_keep_less_of_the_mlp() -> None:
    """Under torch.compile AOTAutograd's partitioner recomputes one of SwiGLU's four f-wide
    tensors (plan.memory.layer_activation_terms, COMPILED_MLP_BYTES_PER_F: 6f kept, not 8f), and
    of autocast's fp32 residual stream (zero.stage 0, layer_activations.residual_stream) the
    compiled block keeps the fp32 input alone, one bf16 copy of each norm output and the
    attention's bf16 output: 10h a token against eager's 18h. llama3-1b at seq 8192, one
    sequence, 16 layers: 16 x 8,192 tokens x (2 x 8,192 + 8 x 2,048) = 4 GiB less, as measured
    on one H100 (4.06 GiB). megatron's fused kernels are not torch.compile and keep them."""
    from launcher.plan.planner import make_plan

    base = ["recipe=llama3-1b", "train.micro_batch_size=1", "train.global_batch_size=1", *H100]
    eager = make_plan(cfg(*base, "backend.compile=false")).memory.heaviest
    compiled_cfg = cfg(*base, "backend.compile=true")
    assert engine_choices(compiled_cfg).compiled_blocks
    compiled = make_plan(compiled_cfg).memory.heaviest
    mlp, stream = 16 * 8192 * 2 * 8192, 16 * 8192 * 8 * 2048
    assert eager.activations - compiled.activations == pytest.approx(mlp + stream)
    megatron = cfg("recipe=llama3-8b", "backend=megatron", *H100)
    assert engine_choices(megatron).compile and not engine_choices(megatron).compiled_blocks
