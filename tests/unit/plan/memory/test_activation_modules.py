"""backend.recompute_modules, backend.offload_modules and backend.swiglu_fusion: Megatron-Core's
checks (exit 2 naming the key), the flags rendered, torch / DeepSpeed refusing them, and what
each module frees in plan/memory/mcore_activations.py, tensor by tensor. Expected values by hand."""

from __future__ import annotations

import pytest

from launcher.backends import raw_refusals
from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.memory.estimate import stage_activations
from launcher.plan.memory.mcore_activations import layer_activations, saved_tensors
from launcher.render.megatron_args import megatron_args
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit

# A small MLA + MoE model on Megatron (DeepSeek-V3's shape, 4 layers, 1 dense).
MOE_MLA = [
    "recipe=deepseek-v3",
    "model.num_layers=4",
    "model.moe_dense_layers=1",
    "parallel.pp=1",
    "parallel.pp_layers=null",
    "parallel.ep=8",
    "parallel.etp=1",
    "cluster=h100-80gb",
    "cluster.num_nodes=1",
    "train.tokens=null",
    "train.steps=10",
    "train.global_batch_size=64",
    "precision=bf16",
    "train.recompute=selective",
]
DENSE = [
    "model=llama3-8b",
    "backend=megatron",
    "cluster=h100-80gb",
    "cluster.num_nodes=1",
    "parallel.tp=2",
    "parallel.sequence_parallel=true",
    "train.steps=10",
    "train.global_batch_size=64",
    "precision=bf16",
    "train.recompute=selective",
]


def cfg(*overrides: str) -> LLMTrainConfig:
    return compose_config(list(overrides)).config


def _refusal_keys(c: LLMTrainConfig) -> list[tuple[str, ...]]:
    return [r.keys for r in raw_refusals(c.backend.name, c)]


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["backend.recompute_modules=[attention]"], "backend.recompute_modules", "'attention'"),
        (
            ["backend.recompute_modules=[mlp]", "train.recompute=none"],
            "train.recompute",
            "selective",
        ),
        (["backend.offload_modules=[attn_proj]"], "backend.offload_modules", "core_attn"),
        (["backend.offload_modules=[expert_fc1]"], "backend.offload_modules", "dense model"),
        (["backend.recompute_modules=[mla_up_proj]"], "model.kv_lora_rank", "multi-latent"),
    ],
)
def test_megatron_core_checks_exit_2_naming_the_key(
    overrides: list[str], key: str, words: str
) -> None:
    result = invoke("validate", *DENSE, *overrides)
    assert result.returncode == 2, shown(result)
    text = " ".join(shown(result).split())
    assert key in text and words in text and "Traceback" not in text


def test_torch_and_deepspeed_refuse_the_keys() -> None:
    for backend in ("torch", "deepspeed"):
        base = [*DENSE, f"backend={backend}", "parallel.tp=1", "parallel.sequence_parallel=false"]
        for extra, key in (
            ("backend.recompute_modules=[core_attn]", "backend.recompute_modules"),
            ("backend.offload_modules=[core_attn]", "backend.offload_modules"),
            ("backend.swiglu_fusion=false", "backend.swiglu_fusion"),
        ):
            assert any(key in k for k in _refusal_keys(cfg(*base, extra))), (backend, key)
        assert not any("backend.recompute_modules" in k for k in _refusal_keys(cfg(*base)))


def test_megatron_renders_the_flags() -> None:
    args = megatron_args(
        cfg(
            *MOE_MLA,
            "backend.recompute_modules=[mla_up_proj,moe_act]",
            "backend.offload_modules=[expert_fc1]",
            "backend.swiglu_fusion=false",
        )
    )
    i = args.index("--recompute-modules")
    assert args[i + 1 : i + 3] == ["mla_up_proj", "moe_act"]
    j = args.index("--offload-modules")
    assert args[j + 1] == "expert_fc1" and "--fine-grained-activation-offloading" in args
    assert "--no-bias-swiglu-fusion" in args and "--moe-grouped-gemm" in args
    plain = megatron_args(cfg(*MOE_MLA))
    assert "--recompute-modules" not in plain and "--offload-modules" not in plain
    assert "--no-bias-swiglu-fusion" not in plain


def test_dense_layer_by_hand() -> None:
    # Llama 3 8B, tp 2 with sequence parallel, bf16, flash attention, per token of the rank's
    # shard: norms' inputs and the QKV / fc1 inputs 4 x 2h / 2 = 4h = 16384; q, k, v
    # 2 (4096 + 1024 + 1024) / 2 = 6144; the attention output 2 x 4096 / 2 = 4096; log-sum-exp
    # 4 x 32 / 2 = 64; fused SwiGLU: fc1 output 2 x 2 x 14336 / 2 = 28672, fc2 input
    # 2 x 14336 / 2 = 14336. Sum 69696 bytes.
    c = cfg(*DENSE, "backend.recompute_modules=[]")
    layout = derive_layout(c)
    per_token = sum(s.bytes_per_token for s in saved_tensors(c, layout, moe=False))
    assert per_token == pytest.approx(69696)
    # Unfused (Megatron-LM before 2024-01): SiLU's output too, 2 x 14336 / 2 more.
    unfused = cfg(*DENSE, "backend.recompute_modules=[]", "backend.swiglu_fusion=false")
    assert sum(
        s.bytes_per_token for s in saved_tensors(unfused, layout, moe=False)
    ) == pytest.approx(69696 + 14336)


def test_each_module_frees_what_it_names() -> None:
    tokens = 4096  # micro-batch 1 x DeepSeek-V3's 4096
    base = cfg(*MOE_MLA, "backend.recompute_modules=[]")
    layout = derive_layout(base)
    none = layer_activations(base, layout, moe=True)
    assert none.recomputed == 0.0 and none.offloaded == 0.0
    h, f_e, top_k = 7168, 2048, 8
    # moe_act: each routed copy's fc2 input, 2 f_e bytes (bf16), tp 1: 8 x 4096 per token.
    act = layer_activations(cfg(*MOE_MLA, "backend.recompute_modules=[moe_act]"), layout, True)
    assert none.kept - act.kept == pytest.approx(tokens * top_k * 2 * f_e)
    # mla_up_proj: q, k, v after the up projections: 2 x (24576 + 24576 + 16384) per token.
    up = layer_activations(cfg(*MOE_MLA, "backend.recompute_modules=[mla_up_proj]"), layout, True)
    assert none.kept - up.kept == pytest.approx(tokens * 2 * (24576 + 24576 + 16384))
    # expert_fc1 offloaded: each routed copy's input, 2h; two layers' worth stays resident.
    off_cfg = cfg(*MOE_MLA, "backend.recompute_modules=[]", "backend.offload_modules=[expert_fc1]")
    off = layer_activations(off_cfg, layout, True)
    assert off.offloaded == pytest.approx(tokens * top_k * 2 * h)
    assert off.transient == pytest.approx(2 * off.offloaded)
    # mlp recomputes dense layers only (transformer_layer.py: "if not self.is_moe_layer").
    mlp = cfg(*MOE_MLA, "backend.recompute_modules=[mlp]")
    assert layer_activations(mlp, layout, True).kept == pytest.approx(none.kept)
    assert layer_activations(mlp, layout, False).kept < layer_activations(base, layout, False).kept


def test_more_modules_never_hold_more_at_the_peak() -> None:
    c0 = cfg(*MOE_MLA, "backend.recompute_modules=[]")
    layout = derive_layout(c0)
    a0, _ = stage_activations(c0, layout, 0)
    c1 = cfg(*MOE_MLA, "backend.recompute_modules=[mla_up_proj,moe_act]")
    a1, _ = stage_activations(c1, layout, 0)
    c2 = cfg(
        *MOE_MLA,
        "backend.recompute_modules=[mla_up_proj,moe_act]",
        "backend.offload_modules=[expert_fc1]",
    )
    a2, _ = stage_activations(c2, layout, 0)
    assert a0 > a1 > a2


def test_time_prices_the_attention_core_again_only_when_listed() -> None:
    from launcher.backends.common import recompute_mode

    assert recompute_mode(cfg(*DENSE), moe=False) == "core"  # Megatron's default, core_attn
    assert recompute_mode(cfg(*DENSE, "backend.recompute_modules=[core_attn]"), False) == "core"
    assert recompute_mode(cfg(*DENSE, "backend.recompute_modules=[layernorm]"), False) == "none"
    # The MLP block again: priced as a layer's forward (an upper bound), on its layer kind only.
    assert recompute_mode(cfg(*DENSE, "backend.recompute_modules=[mlp]"), False) == "full"
    moe = cfg(*MOE_MLA, "backend.recompute_modules=[mlp,mla_up_proj]")
    assert recompute_mode(moe, moe=True) == "none" and recompute_mode(moe, moe=False) == "full"
    assert recompute_mode(cfg(*MOE_MLA, "backend.recompute_modules=[moe]"), moe=True) == "full"


def test_fused_cross_entropy_keeps_the_logits_and_an_fp32_gradient() -> None:
    from launcher.plan.memory.estimate import logits_bytes

    # Llama 3 8B, tp 2: 8192 tokens x 128256 / 2 logits on the GPU. Megatron's unfused
    # vocab-parallel loss: bf16 logits + fp32 copy + fp32 softmax, 10 bytes a logit; Transformer
    # Engine's fused kernel: the bf16 logits and its fp32 gradient, 6.
    plain = cfg(*DENSE, "train.micro_batch_size=1")
    fused = cfg(*DENSE, "train.micro_batch_size=1", "backend.cross_entropy_fusion=true")
    layout = derive_layout(plain)
    logits = 8192 * 128256 / 2
    assert logits_bytes(plain, layout) == pytest.approx(10 * logits)
    assert logits_bytes(fused, layout) == pytest.approx(6 * logits)
    args = megatron_args(fused)
    i = args.index("--cross-entropy-loss-fusion")
    assert args[i + 1 : i + 3] == ["--cross-entropy-fusion-impl", "te"]
    assert "--cross-entropy-loss-fusion" not in megatron_args(plain)
    torch_cfg = cfg(*DENSE, "backend=torch", "backend.cross_entropy_fusion=true")
    assert any("backend.cross_entropy_fusion" in k for k in _refusal_keys(torch_cfg))
