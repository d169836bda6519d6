"""Memory parity with how runs are configured: the eager loss's backward peak, context parallel's
split and K/V ring buffers, the MoE dispatcher's buffers and expert tensor parallel folding.
Expected bytes are derived by hand in the comments."""

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
    TrainConfig,
    ZeroConfig,
)
from launcher.plan.memory.estimate import (
    cp_ring_bytes,
    dispatcher_bytes,
    logits_bytes,
    stage_activations,
    stage_params,
    stage_states,
)
from launcher.render.megatron_args import megatron_args
from tests.unit.plan.memory.test_plan_memory import LLAMA

# LLAMA: h 2048, 16 heads of 128, 4 kv heads (k, v 512 wide each), SwiGLU f 8192, V 32000, s 4096.

pytestmark = pytest.mark.unit

# 8 experts of f 1024, top-2, h 1024, s 2048.
MOE = dataclasses.replace(
    LLAMA,
    name="moe",
    num_layers=4,
    hidden_size=1024,
    ffn_hidden_size=1024,
    num_attention_heads=8,
    num_kv_heads=4,
    seq_length=2048,
    num_experts=8,
    moe_top_k=2,
    moe_ffn_hidden_size=1024,
)


def _cfg(
    model: ModelConfig = LLAMA,
    backend: str = "torch",
    gpus: int = 1,
    recompute: str = "none",
    chunked: bool | None = False,
    **parallel: int,
) -> LLMTrainConfig:
    return LLMTrainConfig(
        model=model,
        parallel=ParallelConfig(**parallel),  # type: ignore[arg-type]
        zero=ZeroConfig(stage=1),
        train=TrainConfig(
            micro_batch_size=1,
            global_batch_size=gpus,
            recompute=recompute,
            chunked_loss=chunked,
        ),
        cluster=ClusterConfig(gpu="h100-sxm", num_nodes=1, gpus_per_node=gpus),
        backend=BackendConfig(name=backend, compile=False if backend == "torch" else None),
    )


def test_eager_loss_peaks_in_its_backward() -> None:
    # Eager F.cross_entropy(logits.float()) with the logits dropped before backward: the saved
    # fp32 log-softmax, nll_loss's fp32 gradient and log_softmax_backward's fp32 result at once,
    # 12 bytes a logit (the forward's 2 + 4 + 4 = 10 is lower): 4096 x 32000 x 12.
    for backend in ("torch", "deepspeed"):
        cfg = _cfg(backend=backend)
        assert logits_bytes(cfg, derive_layout(cfg)) == 4096 * 32000 * 12
    # Megatron's vocab-parallel cross-entropy writes its gradient into the saved softmax: 10.
    mcfg = _cfg(backend="megatron")
    assert logits_bytes(mcfg, derive_layout(mcfg)) == 4096 * 32000 * 10


def test_loss_parallel_backward_holds_four_fp32_logit_tensors() -> None:
    # tp 2, torch: PyTorch's loss_parallel backward (saved log-softmax, zeros, exp, their sum)
    # = 16 bytes a logit of the rank's half of the vocabulary: 4096 x 32000 x 16 / 2.
    cfg = _cfg(gpus=2, tp=2)
    assert logits_bytes(cfg, derive_layout(cfg)) == 4096 * 32000 * 16 / 2


def test_cp_ring_buffers_per_engine() -> None:
    # cp 2: 2048 tokens per rank; K and V 512 wide each: 2048 x 1024 = 2,097,152 elements.
    mcfg = _cfg(backend="megatron", gpus=2, cp=2)
    # Transformer Engine's P2P ring: received K/V, received dK/dV, own dK/dV in bf16: x 3 x 2.
    assert cp_ring_bytes(mcfg, derive_layout(mcfg)) == 2_097_152 * 6
    tcfg = _cfg(gpus=2, cp=2)
    # llmtrain's ring at a backward exchange: K/V sent and received in bf16 (2 x 2 bytes), fp32
    # dK/dV sent and received (2 x 4 bytes): 12 bytes per K/V element; and the fp32 dq
    # accumulator: q 16 x 128 = 2048 wide, 2048 x 2048 = 4,194,304 elements x 4 bytes.
    assert cp_ring_bytes(tcfg, derive_layout(tcfg)) == 2_097_152 * 12 + 4_194_304 * 4
    # fp32 compute: K/V copies of 4 bytes: 2 x 4 + 2 x 4 = 16 per K/V element.
    fcfg = dataclasses.replace(
        tcfg, precision=dataclasses.replace(tcfg.precision, compute_dtype="fp32")
    )
    assert cp_ring_bytes(fcfg, derive_layout(fcfg)) == 2_097_152 * 16 + 4_194_304 * 4
    one = _cfg()
    assert cp_ring_bytes(one, derive_layout(one)) == 0.0


def test_cp_full_recompute_activations_by_hand() -> None:
    # torch engine, cp 2, zero.stage 1 (torch.autocast over fp32 parameters: the residual
    # stream is fp32, each projection casts its own bf16 input; layer_activations.
    # residual_stream), full recompute, eager loss on 2048 tokens a rank:
    # - 16 layer inputs: 16 x 2048 tokens x 4h (8192 B)             =   268,435,456
    # - one layer recomputed in full: per token the norm inputs 2 x 4h = 16,384, the inputs of
    #   wq wk wv and of w1 w3 5 x 2h = 20,480,
    #   + 2 (q 2048 + k 512 + v 512 + o 2048) = 10,240 + lse 4 x 16 = 64 + SwiGLU 8f = 65,536
    #   = 112,704 B x 2048                                          =   230,817,792
    # - the K/V ring (test above): 25,165,824 + 16,777,216          =    41,943,040
    # - the loss: 2048 x 32000 x 12                                 =   786,432,000
    cfg = _cfg(gpus=2, cp=2, recompute="full")
    acts, _ = stage_activations(cfg, derive_layout(cfg), 0)
    assert acts == 268_435_456 + 230_817_792 + 41_943_040 + 786_432_000


def test_cp_ring_attention_stores_no_scores() -> None:
    # Eager attention would keep 2 bytes a score (a s^2 term); under cp the ring keeps q, k, v,
    # out and the log-sum-exp only, as flash does: the same bytes as model.attention=flash.
    for recompute in ("none", "selective"):
        eager = _cfg(
            dataclasses.replace(LLAMA, attention="eager"), gpus=2, cp=2, recompute=recompute
        )
        flash = _cfg(
            dataclasses.replace(LLAMA, attention="flash"), gpus=2, cp=2, recompute=recompute
        )
        a = stage_activations(eager, derive_layout(eager), 0)[0]
        b = stage_activations(flash, derive_layout(flash), 0)[0]
        assert a == b


def test_moe_dispatcher_buffers() -> None:
    # Megatron's default allgather dispatcher, tp 1 x ep 4 on 4 GPUs: the 2048 tokens of each of
    # the 4 ranks gathered (8192) and the unpermuted outputs before the reduce-scatter, each
    # 8192 x 1024 x 2 bytes: 2 x 16,777,216.
    mcfg = _cfg(MOE, backend="megatron", gpus=4, ep=4)
    assert dispatcher_bytes(mcfg, derive_layout(mcfg)) == 2 * 8192 * 1024 * 2
    # llmtrain's all-to-all (ep 4): send copy and received rows of 2048 x top-2 rows, twice
    # (dispatch and combine): 2 x 4096 x 1024 x 2.
    tcfg = _cfg(MOE, gpus=4, ep=4)
    assert dispatcher_bytes(tcfg, derive_layout(tcfg)) == 2 * 4096 * 1024 * 2
    # Without ep nothing travels; a dense model has no dispatcher.
    solo = _cfg(MOE)
    assert dispatcher_bytes(solo, derive_layout(solo)) == 0.0
    dense = _cfg(gpus=4)
    assert dispatcher_bytes(dense, derive_layout(dense)) == 0.0
    # They come on top of the MoE stage's activations (the same per rank with and without ep).
    with_ep = stage_activations(tcfg, derive_layout(tcfg), 0)[0]
    assert with_ep - stage_activations(solo, derive_layout(solo), 0)[0] == 2 * 4096 * 1024 * 2


def test_expert_tensor_parallel_folding() -> None:
    # Megatron, tp 4 x ep 4 on 8 GPUs: dp 2, ep does not divide dp x cp = 2, so llmtrain renders
    # --expert-tensor-parallel-size 1: each expert whole on its rank (routed / ep, not / ep / tp),
    # its states sharded over tp x cp x dp / ep = 2 ranks.
    cfg = _cfg(MOE, backend="megatron", gpus=8, tp=4, ep=4, sequence_parallel=True)  # type: ignore[arg-type]
    layout = derive_layout(cfg)
    assert "--expert-tensor-parallel-size" in megatron_args(cfg)
    # Routed expert parameters of the 4 layers: 4 x 8 experts x 3 x 1024 x 1024 (SwiGLU).
    routed = 4 * 8 * 3 * 1024 * 1024
    assert stage_params(cfg, layout, 0).expert == routed / 4
    # ZeRO-1 (distributed optimizer): 12 bytes of optimizer states a parameter over 2 ranks.
    folded = stage_states(cfg, layout, 0)
    dense_part = stage_params(cfg, layout, 0).dense * 12 / 2
    assert folded.optimizer == pytest.approx(dense_part + routed / 4 * 12 / 2)
