"""Memory, term by term (Megatron's test style) and monotonicity checks."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.config.layout import derive_layout
from launcher.config.schema import (
    BackendConfig,
    ClusterConfig,
    LLMTrainConfig,
    ModelConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
    ZeroConfig,
)
from launcher.plan.memory.estimate import layer_activation_bytes, logits_bytes
from launcher.plan.model_shape import ModelShape
from launcher.plan.planner import checkpoint_bytes, make_plan

pytestmark = pytest.mark.unit

# GPT-3 style block: a = 16 heads, h = 1024, MLP 4h, dropout (LayerNorm model).
GPT = ModelConfig(
    name="gpt",
    num_layers=8,
    hidden_size=1024,
    ffn_hidden_size=4096,
    num_attention_heads=16,
    vocab_size=50000,
    seq_length=2048,
    activation="gelu",
    norm="layernorm",
    position="learned",
    attention="eager",
    linear_bias=True,
    attention_dropout=0.1,
    hidden_dropout=0.1,
)
LLAMA = ModelConfig(
    name="llama",
    num_layers=16,
    hidden_size=2048,
    ffn_hidden_size=8192,
    num_attention_heads=16,
    num_kv_heads=4,
    vocab_size=32000,
    seq_length=4096,
    activation="swiglu",
    norm="rmsnorm",
    position="rope",
    tie_embeddings=False,
)


def act(
    model: ModelConfig,
    tp: int = 1,
    sp: bool = False,
    recompute: str = "none",
    attention: str | None = None,
    b: int = 1,
    cp: int = 1,
) -> float:
    return layer_activation_bytes(
        ModelShape(model),
        micro_batch=b,
        seq=model.seq_length,
        tp=tp,
        cp=cp,
        recompute=recompute,
        attention=attention or model.attention,
        moe=False,
        sequence_parallel=sp,
        dropout=model.norm == "layernorm",
    )


def test_korthikanti_gpt_layer_no_parallelism() -> None:
    # Korthikanti et al. 2022, eq. 1: s b h (34 + 5 a s / h) bytes per layer.
    s, b, h, a = 2048, 1, 1024, 16
    assert act(GPT) == pytest.approx(s * b * h * (34 + 5 * a * s / h))


def test_korthikanti_gpt_layer_with_tp_and_sp() -> None:
    s, b, h, a, t = 2048, 1, 1024, 16, 4
    # eq. 2, TP without SP: s b h (10 + 24/t + 5 a s/(h t)).
    assert act(GPT, tp=t) == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    # eq. 3, TP with SP: s b h (34 + 5 a s/h) / t.
    assert act(GPT, tp=t, sp=True) == pytest.approx(s * b * h * (34 + 5 * a * s / h) / t)
    # Selective (eager): the 5 a s^2 b term goes: s b h 34 / t.
    assert act(GPT, tp=t, sp=True, recompute="selective") == pytest.approx(s * b * h * 34 / t)
    # Full: the layer input only, 2 s b h (/t with SP).
    assert act(GPT, tp=t, sp=True, recompute="full") == pytest.approx(2 * s * b * h / t)


def test_flash_attention_drops_the_s_squared_term() -> None:
    s, h, a = 2048, 1024, 16
    # 34 s b h plus flash's fp32 log-sum-exp (4 bytes per head per token).
    assert act(GPT, attention="flash") == pytest.approx(s * h * 34 + s * 4 * a)


def test_llama_layer_term_by_term() -> None:
    s, h, f, d, kv, a = 4096, 2048, 8192, 128, 4, 16
    expected_per_token = (
        2 * 2 * h  # inputs of the two RMSNorms
        + 2 * h
        + 2 * h  # QKV and MLP matmul inputs
        + 2 * (a * d)
        + 2 * (kv * d) * 2  # Q, K, V
        + 2 * (a * d)  # attention output (o_proj input)
        + 4 * a  # flash log-sum-exp, fp32
        + 8 * f  # SwiGLU: gate, up, silu(gate), product
    )
    assert act(LLAMA) == pytest.approx(s * expected_per_token)
    # Context parallel splits the tokens.
    assert act(LLAMA, cp=2) == pytest.approx(act(LLAMA) / 2)


def test_logits_fp32_on_last_stage() -> None:
    cfg = LLMTrainConfig(
        model=LLAMA,
        parallel=ParallelConfig(tp=2),
        cluster=ClusterConfig(gpu="h100-sxm", gpus_per_node=2),
        backend=BackendConfig(name="megatron"),
    )
    # Megatron: s b V (2 bf16 + 4 fp32 copy + 4 fp32 softmax) / tp.
    assert logits_bytes(cfg, derive_layout(cfg)) == pytest.approx(4096 * 32000 * 10 / 2)


def _cfg(**kw: object) -> LLMTrainConfig:
    base = LLMTrainConfig(
        model=LLAMA,
        train=TrainConfig(micro_batch_size=2, global_batch_size=64),
        cluster=ClusterConfig(gpu="h100-sxm", num_nodes=1, gpus_per_node=8),
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def _device(cfg: LLMTrainConfig) -> float:
    return make_plan(cfg).memory.heaviest.device_total


def test_memory_falls_as_tp_grows() -> None:
    values = [_device(_cfg(parallel=ParallelConfig(tp=t))) for t in (1, 2, 4, 8)]
    assert values == sorted(values, reverse=True)


def test_memory_falls_as_zero_stage_grows() -> None:
    values = [_device(_cfg(zero=ZeroConfig(stage=z))) for z in (0, 1, 2, 3)]
    assert values == sorted(values, reverse=True) and len(set(values)) == 4


def test_fp8_weight_copies_are_transformer_engine_only() -> None:
    # LLAMA has P parameters. bf16 with fp32 master and Adam: weights 2 B/param, checkpoint
    # 2 + 4 + 8 = 14 B/param. Transformer Engine (megatron) adds an fp8 copy and its transpose
    # (+2 B/param) to the weights in memory; torchao (torch) keeps none. Neither is saved in a
    # checkpoint: 14 B/param for all four.
    fp8 = PrecisionConfig(name="fp8", fp8=True)
    runs = {
        (b, f): _cfg(precision=fp8 if f else PrecisionConfig(), backend=BackendConfig(name=b))
        for b in ("megatron", "torch")
        for f in (False, True)
    }
    plans = {k: make_plan(c) for k, c in runs.items()}
    weights = {k: p.memory.heaviest.weights for k, p in plans.items()}
    assert weights[("torch", True)] == weights[("torch", False)]
    # ... of its own linear layers only: the embedding and the output layer stay bf16
    # (Megatron-Core's VocabParallelEmbedding and tensor_parallel.ColumnParallelLinear), as does
    # the final norm the output layer's count includes (h).
    m = runs[("megatron", True)].model
    vocab = m.vocab_size * m.hidden_size * (1 if m.tie_embeddings else 2) + m.hidden_size
    params = plans[("megatron", True)].memory.heaviest.params
    extra = weights[("megatron", True)] - weights[("megatron", False)]
    assert extra == pytest.approx(2.0 * (params - vocab))
    assert weights[("torch", False)] > 0
    sizes = {checkpoint_bytes(c, 1000) for c in runs.values()}
    assert sizes == {14_000}


def test_emulated_fp8_gets_no_fp8_speedup() -> None:
    # torchao's emulate=True multiplies in the compute dtype: the step is planned like bf16's,
    # not at the H100's fp8 peak (twice bf16's), which real fp8 gets.
    torch = BackendConfig(name="torch")
    bf16 = make_plan(_cfg(backend=torch)).time.step_s
    real = make_plan(_cfg(backend=torch, precision=PrecisionConfig(name="fp8", fp8=True)))
    emulated = make_plan(
        _cfg(backend=torch, precision=PrecisionConfig(name="fp8", fp8=True, fp8_emulate=True))
    )
    assert real.time.step_s < 0.97 * emulated.time.step_s
    assert abs(emulated.time.step_s / bf16 - 1) < 0.01
    assert any("emulated" in a for a in emulated.assumptions)


def test_memory_falls_with_recompute() -> None:
    values = [
        _device(_cfg(train=TrainConfig(micro_batch_size=2, global_batch_size=64, recompute=r)))
        for r in ("none", "selective", "full")
    ]
    assert values[0] > values[1] > values[2]


def test_pipeline_first_stage_is_heaviest_under_1f1b_without_big_logits() -> None:
    plan = make_plan(
        _cfg(
            parallel=ParallelConfig(pp=4),
            train=TrainConfig(micro_batch_size=1, global_batch_size=64),
        )
    )
    in_flight = [s.in_flight for s in plan.memory.stages]
    assert in_flight == [4, 3, 2, 1]  # 1F1B: pp - stage
    gpipe = make_plan(
        _cfg(
            parallel=ParallelConfig(pp=4, pp_schedule="gpipe"),
            train=TrainConfig(micro_batch_size=1, global_batch_size=64),
        )
    )
    assert [s.in_flight for s in gpipe.memory.stages] == [32] * 4


def test_offload_moves_optimizer_to_host() -> None:
    plan = make_plan(_cfg(zero=ZeroConfig(stage=2, offload_optimizer="cpu")))
    h = plan.memory.heaviest
    assert h.optimizer == 0 and h.host_bytes > 0


def test_fixes_when_it_does_not_fit() -> None:
    big = dataclasses.replace(
        LLAMA,
        num_layers=48,
        hidden_size=6144,
        ffn_hidden_size=16384,
        num_attention_heads=48,
        num_kv_heads=8,
    )
    cfg = _cfg(model=big, train=TrainConfig(micro_batch_size=4, global_batch_size=64))
    plan = make_plan(cfg)
    assert not plan.memory.fits
    assert plan.fixes
    for fix in plan.fixes:
        assert fix.fits and fix.device_bytes <= plan.memory.usable
        assert "=" in fix.line


def test_headroom_changes_the_verdict_not_the_bytes() -> None:
    cfg = _cfg()
    a = make_plan(cfg, headroom=0.0).memory
    b = make_plan(cfg, headroom=0.5).memory
    assert a.heaviest.device_total == b.heaviest.device_total
    assert a.usable > b.usable
    with pytest.raises(ValueError):
        make_plan(cfg, headroom=1.5)
