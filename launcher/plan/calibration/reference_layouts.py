"""The configurations of the published reference runs
(``launcher.plan.calibration.reference_runs``): the model shapes of each source's family and the
layout, precision and engine choices each source ran, stated where the source is silent
(reference_runs' docstring lists those choices)."""

from __future__ import annotations

from dataclasses import replace

from launcher.config.composition.presets import model_preset
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

GIB = 1024**3
# The DGX-H100 of the NeMo and AutoModel tables and of llm-foundry's H100 rows (SXM, 80 GB).
H100_SXM = "h100-sxm"
# NeMo's performance recipes (module docstring: NP, NL, NB): fp8 with Transformer Engine's
# tensor-parallel communication overlap and bf16 gradients.
NEMO_FP8: dict[str, object] = {"precision": "fp8", "tp_overlap": True, "grad": "bf16"}


def gpt(
    layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048, **kw: object
) -> ModelConfig:
    return ModelConfig(
        **{  # type: ignore[arg-type]
            "name": f"gpt-{layers}x{hidden}",
            "num_layers": layers,
            "hidden_size": hidden,
            "ffn_hidden_size": 4 * hidden,
            "num_attention_heads": heads,
            "vocab_size": vocab,
            "seq_length": seq,
            "activation": "gelu",
            "norm": "layernorm",
            "position": "learned",
            "tie_embeddings": True,
            "attention": "eager",
            "linear_bias": True,
            # Megatron-LM's defaults (--attention-dropout / --hidden-dropout 0.1).
            "attention_dropout": 0.1,
            "hidden_dropout": 0.1,
            **kw,
        }
    )


def llama(
    layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int, **kw: object
) -> ModelConfig:
    return ModelConfig(
        **{  # type: ignore[arg-type]
            "name": f"llama-{layers}x{hidden}",
            "num_layers": layers,
            "hidden_size": hidden,
            "ffn_hidden_size": ffn,
            "num_attention_heads": heads,
            "num_kv_heads": kv,
            "vocab_size": vocab,
            "seq_length": seq,
            "activation": "swiglu",
            "norm": "rmsnorm",
            "position": "rope",
            "tie_embeddings": False,
            "attention": "flash",
            "linear_bias": False,
            **kw,
        }
    )


def nemotron(layers: int, hidden: int, heads: int, kv: int, ffn: int, seq: int) -> ModelConfig:
    # Squared-ReLU MLP (two matrices, like GELU), no dropout, RoPE, untied, 256k vocabulary.
    return llama(
        layers,
        hidden,
        heads,
        kv,
        ffn,
        256000,
        seq,
        activation="gelu",
        norm="layernorm",
        attention_dropout=0.0,
        hidden_dropout=0.0,
    )


def mpt(layers: int, hidden: int, heads: int, seq: int) -> ModelConfig:
    return gpt(
        layers,
        hidden,
        heads,
        50368,
        seq,
        attention="flash",
        linear_bias=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
    )


def run_config(
    rid: str,
    model: ModelConfig,
    gpu: str,
    gpus: int,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    vpp: int = 1,
    mbs: int = 1,
    gbs: int,
    recompute: str = "none",
    precision: str = "bf16",
    backend: str = "megatron",
    zero: int = 1,
    grad: str = "fp32",
    overlap: bool = True,
    tp_overlap: bool = False,
    compile: bool = False,
    gpn: int = 8,
    kernel: str | None = None,
    dispatcher: str | None = None,
) -> LLMTrainConfig:
    if precision == "fp16":
        prec = PrecisionConfig(
            name="fp16", compute_dtype="fp16", grad_dtype="fp16", loss_scaling="dynamic"
        )
    elif precision == "bf16-pure":
        # bf16 weights with no fp32 master copy; `grad` stays the reduce dtype.
        prec = PrecisionConfig(
            name="bf16-pure", compute_dtype="bf16", master_weights=False, grad_dtype=grad
        )
    else:
        prec = PrecisionConfig(
            name=precision, compute_dtype="bf16", grad_dtype=grad, fp8=precision == "fp8"
        )
    sched = "interleaved" if vpp > 1 else "1f1b"
    return LLMTrainConfig(
        recipe=f"calibration-{rid}",
        model=model,
        parallel=ParallelConfig(
            tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, sequence_parallel=tp > 1, pp_schedule=sched
        ),
        zero=ZeroConfig(stage=zero),
        precision=prec,
        # Published runs materialize the full logits (llmtrain's chunked loss is its own).
        train=TrainConfig(
            micro_batch_size=mbs,
            global_batch_size=gbs,
            steps=1,
            recompute=recompute,
            chunked_loss=False,
        ),
        cluster=ClusterConfig(name=gpu, gpu=gpu, num_nodes=max(1, gpus // gpn), gpus_per_node=gpn),
        backend=BackendConfig(
            name=backend,
            overlap_comm=overlap,
            tp_comm_overlap=tp_overlap,
            compile=compile,
            attention_kernel=kernel,
            moe_dispatcher=dispatcher,
        ),
    )


def torchtitan_70b(rid: str, l70: ModelConfig, tp_overlap: bool) -> LLMTrainConfig:
    """T4 rows: torchtitan Llama 3 70B on 256 H100 96GB, FSDP + tp8, full AC, fp8, compile,
    with or without async TP."""
    return run_config(
        rid,
        l70,
        "h100-96gb",
        256,
        tp=8,
        mbs=16,
        gbs=512,
        recompute="full",
        precision="fp8",
        backend="torch",
        zero=3,
        compile=True,
        tp_overlap=tp_overlap,
    )


def torchtitan_long_context(rid: str, l8: ModelConfig, seq: int, cp: int) -> LLMTrainConfig:
    """T2 rows: torchtitan Llama 3.1 8B on 8 H100 96GB, FSDP + cp, full AC, fp8, compile, one
    global batch of 8 sequences' worth of tokens at every length."""
    return run_config(
        rid,
        replace(l8, seq_length=seq),
        "h100-96gb",
        8,
        cp=cp,
        gbs=8 // cp,
        recompute="full",
        precision="fp8",
        backend="torch",
        zero=3,
        compile=True,
    )


def step_from_tps(cfg: LLMTrainConfig, tps: float, gpus: int) -> float:
    gbs = cfg.train.global_batch_size or 1
    return gbs * cfg.model.seq_length / (tps * gpus)


def nemo_llama_step(cfg: LLMTrainConfig, tf: float, gpus: int) -> float:
    """NeMo's llama FLOP formula per iteration (full s^2 attention) over TFLOP/s x GPUs."""
    m = cfg.model
    gbs = cfg.train.global_batch_size or 1
    s, h, layers = m.seq_length, m.hidden_size, m.num_layers
    kv = m.num_kv_heads or m.num_attention_heads
    per = (
        12.0
        + 12.0 * kv / m.num_attention_heads
        + 18.0 * m.ffn_hidden_size / h
        + 12.0 * s / h
        + 6.0 * m.vocab_size / (layers * h)
    )
    return gbs * s * layers * h * h * per / (tf * 1e12 * gpus)


def p482_config(tp: int, pp: int, mbs: int, gbs: int) -> LLMTrainConfig:
    model = model_preset("llama2-7b", seq_length=2048, attention="flash")
    cfg = run_config("p482", model, "h800", 8, tp=tp, pp=pp, mbs=mbs, gbs=gbs)
    return replace(
        cfg,
        parallel=replace(cfg.parallel, sequence_parallel=False),
        # Measured in 2023-09/10 (NVIDIA/Megatron-LM PR #482, opened 2023-09-01, results posted
        # 2023-10-07): before Megatron-core's fused SwiGLU (fused_bias_swiglu.py added
        # 2023-11-15, its --no-bias-swiglu-fusion switch 2024-01-09): swiglu_fusion=False.
        backend=replace(
            cfg.backend,
            reduce_bucket_size=40_000_000,
            allgather_bucket_size=40_000_000,
            swiglu_fusion=False,
        ),
    )
