"""The published reference runs the planner's constants are fitted on and held to: each a
configuration plus the value measured, in the planner's own units.

The published figures come from bench/data/calibration.csv (its README says where that file came
from); each run names its row (`row`) and the figure as the source prints it (`published`:
TFLOP/s or tokens/s per GPU, seconds per step, GiB), and bench/reference_data.py checks that every
one of them is in that row of the file. bench/plan_fit.py fits the constants (fitted.py) on these
runs and bench/plan_calibration.py cross-validates them.

Each row's `source` is the table or paper it comes from (the leave-one-source-out unit of
``bench/plan_calibration.py``): N (Narayanan et al. 2021), T (torchtitan benchmarks), P482
(Megatron-LM get_training_info), NP (NeMo 24.07 H100 fp8), NL (NeMo long context), NB (NeMo 25.02
B200), AM (NeMo AutoModel FSDP2), MP (llm-foundry MPT), AO (torchao / torchtitan mxfp8).

Choices made where a source is silent (each also stated in the CSV's last column):
- N1-N5: micro-batch 1; Megatron 2021 did not overlap the data-parallel all-reduce
  (overlap_comm=False) and reduced fp16 gradients; eager attention, dropout on. Measured step time =
  96 B s l h^2 (1 + s/6h + V/16lh) / (TFLOP/s * n_gpus) (the paper's own FLOP count).
- NP, NL, NB (NeMo / Megatron-core): distributed optimizer (ZeRO-1), sequence parallel when tp > 1,
  Transformer Engine tp-comm-overlap on (the NeMo performance recipes enable it), no recompute
  (NL: not stated, none assumed), flash attention, bf16 gradients for fp8 runs (NB's note on the
  NeMo performance scripts, assumed for NP and NL too).
  NL: TFLOP/s converted with NeMo's llama formula (full s^2 attention), the convention of the
  sibling table.
- T (torchtitan): FSDP2 = ZeRO-3 over dp*cp, fp32 reduce, op-level selective or full AC as
  stated, compile per row; peak memory is max_memory_reserved.
- P482: Llama2-7B, 8 x H800, bf16, distributed optimizer, flash attention, no recompute; the tool
  prints GiB. Sequence length 2048 (the tool's own example; at 4096 the weights and optimizer plus
  the activations exceed what was measured).
- NP10 (Nemotron-4 340B): its NeMo launcher config sets the optimizer's dtype to bf16 (Adam's
  states in bf16, no master copy: precision.master_weights=false, optim.state_dtype=bf16; cited
  at _nemotron4_340b_optimizer).
- AM (AutoModel, FSDP2, TE, DeepEP, fake balanced gate): full activation checkpointing; DeepEP
  priced as backend.moe_dispatcher=flex (which llmtrain's torch engine itself refuses). AM1-AM3
  (the MoE parallelizer): bf16 parameters with no fp32 master (precision=bf16-pure, fp32
  reduce) and no resharding after the forward (zero.stage=2), cited at _automodel_runs; AM4
  (dense) FSDP2 ZeRO-3 in mixed precision.
- NB7, NB8 (NeMo Mixtral): backend.moe_dispatcher=alltoall, NeMo's MixtralConfig's dispatcher.
- MP (Composer FSDP FULL_SHARD): MPT blocks (LayerNorm without bias, GELU MLP of 4h, no dropout,
  tied embeddings), flash attention.
- AO1: B200 "power limited" with the limit not stated: its time is not scored, its memory is (a
  known miss: the torchtitan of 2025 it ran compiles the loss with the model when compile is on,
  components/loss.py build_cross_entropy_loss: torch.compile(loss_fn), a fused loss without the
  fp32 log-softmax tensors, which llmtrain's engines do not do and no key expresses; the T rows,
  torchtitan of 2024, ran the loss eager: "TODO: compiling loss function causes CUDA errors").
- PT1 (pith-train Qwen3-30B-A3B, DualPipeV): not used: tp, dp, micro-batch, sequence length and
  recompute are all "?" in the source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from launcher.config.composition.presets import model_preset
from launcher.config.schema import LLMTrainConfig, ModelConfig, PrecisionConfig
from launcher.plan.calibration.reference_layouts import (
    GIB,
    H100_SXM,
    NEMO_FP8,
    gpt,
    llama,
    mpt,
    nemo_llama_step,
    nemotron,
    p482_config,
    run_config,
    step_from_tps,
    torchtitan_70b,
    torchtitan_long_context,
)
from launcher.plan.flops import narayanan_flops_per_iteration


@dataclass(frozen=True)
class ReferenceRun:
    id: str
    metric: str  # "step_s" | "tokens_per_s_per_gpu" | "allocated_bytes" | "reserved_bytes"
    measured: float
    config: LLMTrainConfig
    note: str
    source: str = ""
    scored: bool = True  # False: shown, not fitted nor counted (a missing input, stated)
    published: float = 0.0  # the figure as the source prints it (bench/data/calibration.csv)

    @property
    def csv_row(self) -> str:
        """The id of the csv row the figure is in: the run's id up to its first lower-case
        letter or dash (T1c, T1f: the T1 row's notes; T2cp4: T2's; P482-tp2: P482's)."""
        found = re.match(r"[A-Z]+[0-9]*", self.id)
        return found.group(0) if found else self.id


def _tps(rid: str, src: str, cfg: LLMTrainConfig, gpus: int, tps: float) -> ReferenceRun:
    step = step_from_tps(cfg, tps, gpus)
    return ReferenceRun(rid, "step_s", step, cfg, f"{tps:g} tok/s/GPU", src, published=tps)


def _gib(
    rid: str, metric: str, gib: float, cfg: LLMTrainConfig, note: str, src: str
) -> ReferenceRun:
    """A memory run: `gib` GiB (as published) of `metric`."""
    return ReferenceRun(rid, metric, gib * GIB, cfg, note, src, published=gib)


def _narayanan(
    rid: str, layers: int, hidden: int, heads: int, gpus: int, tp: int, pp: int, gbs: int, tf: float
) -> ReferenceRun:
    cfg = run_config(
        rid,
        gpt(layers, hidden, heads),
        "a100-80gb",
        gpus,
        tp=tp,
        pp=pp,
        gbs=gbs,
        recompute="full",
        precision="fp16",
        zero=0,
        overlap=False,
    )
    cfg = replace(cfg, parallel=replace(cfg.parallel, sequence_parallel=False))
    flops = narayanan_flops_per_iteration(gbs, 2048, layers, hidden, 51200)
    step = flops / (tf * 1e12 * gpus)
    note = f"{tf:g} TFLOP/s/GPU on {gpus} A100"
    return ReferenceRun(rid, "step_s", step, cfg, note, "N", published=tf)


def _narayanan_runs() -> list[ReferenceRun]:
    """N1-N5: Narayanan et al. 2021, Megatron-LM on A100 80GB."""
    return [
        _narayanan("N1", 24, 2304, 24, 32, 1, 1, 512, 137),
        _narayanan("N2", 30, 3072, 32, 64, 2, 1, 512, 138),
        _narayanan("N3", 36, 4096, 32, 128, 4, 1, 512, 142),
        _narayanan("N4", 40, 6144, 48, 256, 8, 1, 1024, 135),
        _narayanan("N5", 48, 8192, 64, 512, 8, 2, 1536, 138),
    ]


def _torchtitan_runs(l8: ModelConfig, l70: ModelConfig) -> list[ReferenceRun]:
    """T1, T2, T4: torchtitan benchmarks on H100 96GB."""
    out: list[ReferenceRun] = []
    # torchtitan (H100 96GB HBM2e, 500 W).
    t1 = run_config(
        "T1", l8, "h100-96gb", 8, mbs=2, gbs=16, recompute="selective", backend="torch", zero=3
    )
    out.append(_tps("T1", "T", t1, 8, 5762))
    out.append(_tps("T1c", "T", replace(t1, backend=replace(t1.backend, compile=True)), 8, 6667))
    t1f = run_config(
        "T1f",
        l8,
        "h100-96gb",
        8,
        mbs=2,
        gbs=16,
        recompute="selective",
        backend="torch",
        zero=3,
        precision="fp8",
        compile=True,
    )
    out.append(_tps("T1f", "T", t1f, 8, 8532))
    for rid, seq, cp, tps in (
        ("T2", 32768, 1, 3890),
        ("T2cp2", 65536, 2, 2540),
        ("T2cp4", 131072, 4, 1071),
        ("T2cp8", 262144, 8, 548),
    ):
        cfg = torchtitan_long_context(rid, l8, seq, cp)
        out.append(_tps(rid, "T", cfg, 8, tps))
    for rid, tpo, tps in (("T4", False, 829), ("T4a", True, 876)):
        cfg = torchtitan_70b(rid, l70, tpo)
        out.append(_tps(rid, "T", cfg, 256, tps))
    return out


def _nemo_h100_runs(l8: ModelConfig, l70: ModelConfig) -> list[ReferenceRun]:
    """NP1-NP12: NeMo 24.07 performance summary, DGX-H100, fp8."""
    out: list[ReferenceRun] = []
    h, nemo = H100_SXM, NEMO_FP8
    np_rows: list[tuple[str, ModelConfig, int, dict[str, int], float]] = [
        (
            "NP1",
            gpt(24, 4096, 32, seq=2048, attention="flash"),
            64,
            {"mbs": 4, "gbs": 2048},
            23406,
        ),
        ("NP2", gpt(44, 6144, 48, attention="flash"), 64, {"tp": 2, "mbs": 2, "gbs": 256}, 5851),
        (
            "NP3",
            gpt(96, 12288, 96, attention="flash"),
            128,
            {"tp": 4, "pp": 8, "vpp": 6, "gbs": 256},
            716,
        ),
        (
            "NP4",
            gpt(96, 12288, 96, attention="flash"),
            512,
            {"tp": 4, "pp": 8, "vpp": 6, "mbs": 2, "gbs": 2048},
            825,
        ),
        ("NP5", model_preset("llama2-7b", seq_length=4096), 8, {"gbs": 128}, 16934),
        (
            "NP6",
            llama(40, 5120, 40, 40, 13824, 32000, 4096),
            16,
            {"pp": 4, "vpp": 10, "gbs": 128},
            8715,
        ),
        (
            "NP7",
            llama(80, 8192, 64, 8, 28672, 32000, 4096),
            64,
            {"tp": 4, "pp": 4, "vpp": 20, "gbs": 128},
            1728,
        ),
        (
            "NP8",
            nemotron(32, 4096, 32, 32, 16384, 4096),
            64,
            {"tp": 2, "mbs": 4, "gbs": 256},
            12507,
        ),
        (
            "NP9",
            nemotron(40, 6144, 48, 48, 24576, 4096),
            64,
            {"tp": 2, "pp": 4, "vpp": 10, "mbs": 2, "gbs": 256},
            4312,
        ),
        (
            "NP10",
            nemotron(96, 18432, 96, 8, 73728, 4096),
            128,
            {"tp": 8, "pp": 8, "vpp": 12, "gbs": 32},
            326,
        ),
        ("NP11", l8, 8, {"cp": 2, "gbs": 128}, 12273),
        ("NP12", l70, 64, {"tp": 4, "pp": 4, "cp": 2, "vpp": 5, "gbs": 128}, 1524),
    ]
    for rid, model, gpus, np_lay, np_tps in np_rows:
        cfg = run_config(rid, model, h, gpus, **np_lay, **nemo)  # type: ignore[arg-type]
        if rid == "NP10":
            cfg = _nemotron4_340b_optimizer(cfg)
        out.append(_tps(rid, "NP", cfg, gpus, np_tps))
    return out


def _nemotron4_340b_optimizer(cfg: LLMTrainConfig) -> LLMTrainConfig:
    """NP10's optimizer as NeMo 24.07 ran Nemotron-4 340B: Adam's states in bf16, no master.

    NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/nemotron_340b.yaml
    (@7c842fcd 2024-06-17 through @dbdb2355 2024-07-30, NeMo 24.07's launcher; the only model
    of the NP rows whose config says so): megatron_amp_O2: true (line 107), optim
    distributed_fused_adam with grad_sync_dtype: bf16 and dtype: bf16 (lines 159-162).
    NVIDIA/NeMo @8e3d65dcfe megatron_base_model.py lines 791-807: the optimizer dtype (bf16)
    equals the O2 model dtype, so store_params=False: Apex's DistributedFusedAdam keeps m and
    v in bf16 and no master copy of the bf16 weights (4 bytes a parameter, sharded over dp)."""
    return replace(
        cfg,
        precision=replace(cfg.precision, master_weights=False),
        optim=replace(cfg.optim, state_dtype="bf16"),
    )


def _nemo_long_context_runs() -> list[ReferenceRun]:
    """NL1-NL7: NeMo long-context Llama 2 7B with context parallelism, H100."""
    out: list[ReferenceRun] = []
    h, nemo = H100_SXM, NEMO_FP8
    # NeMo long context (Llama2-7B fp8, CP), TFLOP/s with NeMo's llama formula.
    l2 = model_preset("llama2-7b")
    for rid, seq, gpus, tp, cp, gbs, tf in (
        ("NL1", 16384, 16, 2, 1, 256, 660),
        ("NL2", 32768, 32, 2, 2, 128, 610),
        ("NL3", 65536, 64, 4, 2, 64, 574),
        ("NL4", 131072, 128, 4, 4, 32, 555),
        ("NL5", 262144, 256, 4, 8, 16, 549),
        ("NL6", 524288, 512, 8, 16, 8, 549),
        ("NL7", 1048576, 1024, 8, 32, 4, 536),
    ):
        cfg = run_config(rid, replace(l2, seq_length=seq), h, gpus, tp=tp, cp=cp, gbs=gbs, **nemo)  # type: ignore[arg-type]
        out.append(
            ReferenceRun(
                rid,
                "step_s",
                nemo_llama_step(cfg, tf, gpus),
                cfg,
                f"{tf:g} TFLOP/s/GPU",
                "NL",
                published=tf,
            )
        )
    return out


def _nemo_b200_runs(l8: ModelConfig, l70: ModelConfig) -> list[ReferenceRun]:
    """NB1-NB8: NeMo 25.02, DGX-B200, fp8."""
    out: list[ReferenceRun] = []
    # NeMo 25.02, DGX-B200, fp8, bf16 gradients.
    b, nb = "b200", NEMO_FP8
    mixtral22 = llama(
        56, 6144, 48, 8, 16384, 32000, 65536, num_experts=8, moe_top_k=2, moe_ffn_hidden_size=16384
    )
    nb_rows: list[tuple[str, ModelConfig, int, dict[str, int], float]] = [
        (
            "NB1",
            gpt(96, 12288, 96, attention="flash", attention_dropout=0.0, hidden_dropout=0.0),
            512,
            {"tp": 4, "pp": 4, "vpp": 6, "mbs": 2, "gbs": 2048},
            1600,
        ),
        ("NB2", l8, 8, {"mbs": 2, "gbs": 128}, 26006),
        ("NB3", l70, 64, {"tp": 2, "pp": 4, "cp": 2, "vpp": 5, "gbs": 128}, 3062),
        (
            "NB4",
            model_preset("llama3-405b", seq_length=8192),
            128,
            {"tp": 4, "pp": 8, "cp": 2, "vpp": 8, "gbs": 64},
            625,
        ),
        ("NB5", nemotron(32, 6144, 48, 8, 24576, 4096), 64, {"mbs": 2, "gbs": 256}, 14760),
        (
            "NB6",
            nemotron(96, 18432, 96, 8, 73728, 4096),
            128,
            {"tp": 8, "pp": 4, "vpp": 12, "gbs": 32},
            602,
        ),
        (
            "NB7",
            model_preset("mixtral-8x7b", seq_length=4096),
            64,
            {"ep": 8, "mbs": 2, "gbs": 256},
            15457,
        ),
        ("NB8", mixtral22, 256, {"tp": 2, "pp": 4, "cp": 8, "ep": 8, "vpp": 14, "gbs": 64}, 2232),
    ]
    for rid, model, gpus, nb_lay, nb_tps in nb_rows:
        # NB7, NB8 (Mixtral): the CSV names no dispatcher; NeMo's MixtralConfig, which its
        # performance scripts build on, sets moe_token_dispatcher_type "alltoall"
        # (nemo/collections/llm/gpt/model/mixtral.py). The dense rows have none.
        moe = {"dispatcher": "alltoall"} if model.num_experts else {}
        cfg = run_config(rid, model, b, gpus, **nb_lay, **nb, **moe)  # type: ignore[arg-type]
        out.append(_tps(rid, "NB", cfg, gpus, nb_tps))
    return out


def _automodel_runs(l70: ModelConfig) -> list[ReferenceRun]:
    """AM1-AM4: NeMo AutoModel, FSDP2 on DGX-H100."""
    out: list[ReferenceRun] = []
    h = H100_SXM
    # NeMo AutoModel, FSDP2 on DGX-H100, bf16, full activation checkpointing.
    qwen = llama(
        48,
        2048,
        32,
        4,
        6144,
        151936,
        4096,
        head_dim=128,
        num_experts=128,
        moe_top_k=8,
        moe_ffn_hidden_size=768,
    )
    dsv3 = model_preset("deepseek-v3")
    # AM1-AM3 ran "TE + DeepEP" (the CSV's notes): node-deduplicated dispatch, flex. llmtrain's
    # torch engine refuses flex (it runs alltoall), but the planner prices what AutoModel ran;
    # AM4 is dense (no dispatcher).
    # AM1-AM3 (NVIDIA-NeMo/Automodel 8d9bfb90e, the commit that published AM1's figure): the
    # MoE models are built on meta and initialised by load_model_from_base_checkpoint
    # (components/checkpoint/checkpointing.py:233, model.initialize_weights()), whose default
    # dtype is bf16 and which ends in self.to(dtype) (models/qwen3_moe/model.py:256-272,
    # models/deepseek_v3/model.py:284-300): the parameters FSDP2 shards are bf16, so
    # torch.optim.Adam's m and v are bf16 and there is no fp32 master (bf16-pure); gradients
    # are reduced in fp32 (components/moe/parallelizer.py:127, reduce_dtype=torch.float32).
    # parallelize_model's reshard_after_forward defaults to False (parallelizer.py:187; AM2's
    # and AM3's yaml set it false, AM1's leaves the default): FSDP2 without resharding after
    # the forward, llmtrain's zero.stage=2 on backend=torch.
    am = {
        "backend": "torch",
        "zero": 2,
        "recompute": "full",
        "kernel": "te",
        "dispatcher": "flex",
        "precision": "bf16-pure",
    }
    am_rows: list[tuple[str, ModelConfig, int, dict[str, object], float]] = [
        ("AM1", qwen, 8, {"ep": 8, "mbs": 4, "gbs": 512}, 21.773),
        ("AM2", dsv3, 256, {"pp": 4, "ep": 64, "vpp": 8, "gbs": 512}, 8.18),
        ("AM3", dsv3, 1024, {"pp": 4, "ep": 64, "vpp": 8, "gbs": 8192}, 37.87),
    ]
    for rid, model, gpus, am_lay, step in am_rows:
        cfg = run_config(rid, model, h, gpus, **am_lay, **am)  # type: ignore[arg-type]
        out.append(
            ReferenceRun(rid, "step_s", step, cfg, f"{step:g} s per step", "AM", published=step)
        )
    # AM4 (dense Llama 3 70B, the generic FSDP2 parallelizer): ZeRO-3 in mixed precision.
    am4 = run_config(
        "AM4",
        l70,
        h,
        64,
        cp=2,
        gbs=128,
        compile=True,
        backend="torch",
        zero=3,
        recompute="full",
        kernel="te",
    )
    out.append(ReferenceRun("AM4", "step_s", 18.9, am4, "18.9 s per step", "AM", published=18.9))
    return out


def _mpt_runs() -> list[ReferenceRun]:
    """MP1-MP18: llm-foundry MPT benchmarks (Composer FSDP)."""
    out: list[ReferenceRun] = []
    h = H100_SXM
    # llm-foundry MPT (Composer FSDP FULL_SHARD).
    mp_rows = [
        ("MP1", 80, 8192, 64, 2048, h, 64, 8, 2048, "full", "bf16", 1039),
        ("MP2", 48, 7168, 56, 8192, h, 8, 1, 168, "full", "bf16", 1384),
        ("MP3", 48, 7168, 56, 2048, h, 32, 14, 1344, "full", "bf16", 2308),
        ("MP4", 40, 5120, 40, 32768, h, 8, 1, 24, "full", "bf16", 1976),
        ("MP5", 40, 5120, 40, 2048, h, 64, 2, 128, "none", "bf16", 4800),
        ("MP6", 32, 4096, 32, 65536, h, 8, 1, 16, "full", "bf16", 1956),
        ("MP7", 32, 4096, 32, 2048, h, 8, 6, 48, "none", "bf16", 10643),
        ("MP8", 32, 2560, 20, 2048, h, 64, 6, 1152, "none", "bf16", 22525),
        ("MP9", 24, 2048, 16, 2048, h, 8, 14, 112, "none", "bf16", 45455),
        ("MP10", 32, 2560, 20, 2048, h, 8, 10, 480, "none", "fp8", 30586),
        ("MP11", 24, 2048, 16, 8192, h, 8, 2, 64, "none", "fp8", 32010),
        ("MP12", 80, 8192, 64, 2048, "a100-80gb", 64, 8, 2048, "full", "bf16", 410),
        ("MP13", 48, 7168, 56, 2048, "a100-80gb", 8, 3, 504, "full", "bf16", 916),
        ("MP14", 40, 5120, 40, 32768, "a100-80gb", 8, 1, 24, "full", "bf16", 1016),
        ("MP15", 32, 4096, 32, 2048, "a100-80gb", 8, 6, 96, "none", "bf16", 4641),
        ("MP16", 24, 2048, 16, 2048, "a100-80gb", 8, 14, 448, "none", "bf16", 20513),
        ("MP17", 80, 8192, 64, 2048, "a100-40gb", 128, 4, 512, "full", "bf16", 376),
        ("MP18", 32, 4096, 32, 2048, "a100-40gb", 128, 18, 2304, "full", "bf16", 3623),
    ]
    for rid, layers, hid, heads, seq, gpu, gpus, mbs, gbs, rec, prec, tps in mp_rows:
        cfg = run_config(
            rid,
            mpt(layers, hid, heads, seq),
            str(gpu),
            gpus,
            mbs=mbs,
            gbs=gbs,
            recompute=str(rec),
            precision=str(prec),
            backend="torch",
            zero=3,
        )
        out.append(_tps(str(rid), "MP", cfg, gpus, float(tps)))
    return out


def _torchao_runs(l8: ModelConfig) -> list[ReferenceRun]:
    """AO1: torchao / torchtitan mxfp8 on B200 (time not scored)."""
    out: list[ReferenceRun] = []
    ao = run_config(
        "AO1", l8, "b200", 8, gbs=8, recompute="selective", backend="torch", zero=3, compile=True
    )
    out.append(
        ReferenceRun(
            "AO1",
            "step_s",
            step_from_tps(ao, 8307.5, 8),
            ao,
            "8307.5 tok/s/GPU, power limit not stated: not scored",
            "AO",
            scored=False,
            published=8307.5,
        )
    )
    return out


def _time_points() -> list[ReferenceRun]:
    l8 = model_preset("llama3-8b", attention="flash")
    l70 = model_preset("llama3-70b", attention="flash", seq_length=8192)
    return [
        *_narayanan_runs(),
        *_torchtitan_runs(l8, l70),
        *_nemo_h100_runs(l8, l70),
        *_nemo_long_context_runs(),
        *_nemo_b200_runs(l8, l70),
        *_automodel_runs(l70),
        *_mpt_runs(),
        *_torchao_runs(l8),
    ]


def _memory_points() -> list[ReferenceRun]:
    l8 = model_preset("llama3-8b", attention="flash")
    l70 = model_preset("llama3-70b", attention="flash", seq_length=8192)
    out: list[ReferenceRun] = []
    t1 = run_config(
        "T1", l8, "h100-96gb", 8, mbs=2, gbs=16, recompute="selective", backend="torch", zero=3
    )
    out.append(_gib("T1", "reserved_bytes", 82.4, t1, "peak reserved", "T"))
    t1c = replace(t1, backend=replace(t1.backend, compile=True))
    out.append(_gib("T1c", "reserved_bytes", 77.0, t1c, "+compile", "T"))
    t1f = replace(t1c, precision=PrecisionConfig(name="fp8", grad_dtype="fp32", fp8=True))
    out.append(_gib("T1f", "reserved_bytes", 76.8, t1f, "+compile+fp8", "T"))
    for rid, seq, cp, gib in (
        ("T2", 32768, 1, 83.9),
        ("T2cp2", 65536, 2, 84.2),
        ("T2cp4", 131072, 4, 84.0),
        ("T2cp8", 262144, 8, 84.5),
    ):
        cfg = torchtitan_long_context(rid, l8, seq, cp)
        out.append(_gib(rid, "reserved_bytes", gib, cfg, "peak reserved", "T"))
    for rid, tpo, gib in (("T4", False, 71.9), ("T4a", True, 67.6)):
        cfg = torchtitan_70b(rid, l70, tpo)
        out.append(_gib(rid, "reserved_bytes", gib, cfg, "peak reserved", "T"))
    for rid, tp, pp, mbs, gbs, gib, note in (
        ("P482", 1, 1, 2, 2048, 69.1, "DP8 MBS2"),
        ("P482-tp2", 2, 1, 4, 512, 55.7, "TP2 DP4 MBS4"),
        ("P482-pp2", 1, 2, 2, 2048, 49.8, "PP2 DP4 MBS2"),
        ("P482-tp8", 8, 1, 4, 128, 28.8, "TP8 DP1 MBS4"),
    ):
        out.append(_gib(rid, "allocated_bytes", gib, p482_config(tp, pp, mbs, gbs), note, "P482"))
    ao = run_config(
        "AO1", l8, "b200", 8, gbs=8, recompute="selective", backend="torch", zero=3, compile=True
    )
    out.append(_gib("AO1", "reserved_bytes", 33.71, ao, "peak memory", "AO"))
    return out


def points() -> list[ReferenceRun]:
    # Each row with the speed keys it ran with (launcher/plan/calibration/speed_keys.py).
    from launcher.plan.calibration.speed_keys import with_speed_keys

    rows = _time_points() + _memory_points()
    return [replace(p, config=with_speed_keys(p.id, p.config)) for p in rows]


def predicted(point: ReferenceRun) -> float:
    from launcher.plan.planner import make_plan

    plan = make_plan(point.config)
    if point.metric == "step_s":
        return plan.time.step_s
    if point.metric == "tokens_per_s_per_gpu":
        return plan.time.tokens_per_s_per_gpu
    heaviest = plan.memory.heaviest
    if point.metric == "allocated_bytes":
        return heaviest.allocated
    return heaviest.reserved_observed


__all__ = ["ReferenceRun", "points", "predicted", "replace"]
