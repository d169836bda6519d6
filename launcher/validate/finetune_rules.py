"""The rules of ``finetune=lora|qlora`` (docs/finetuning.md): values, targets the model has, and
the combinations the engines run. ``launcher.validate.rules`` registers them (rule "finetune"),
so `validate`, `plan`, the search and the engines see the same refusals; never imports torch.
Each problem is (severity, keys, message), the fields of ``rules.Violation``.

What runs (each checked on CPU by tests/integration/test_lora.py or the engine's own tests):
- lora: backend=torch with DDP, FSDP2 (zero 2/3), ZeRO-1, tensor parallel (A/B sharded like the
  weight they adapt), pipeline parallel and context parallel; backend=deepspeed with ZeRO 0-3 and
  no tp/pp. Refused: sequence parallel with tp (the adapters' sequence shards would need their
  own reduction), fewer kv heads than tp with k/v targets (replicated kv heads), fp8, MoE models
  (expert weights are grouped-GEMM tensors, not linears), multi-head latent attention, Megatron-LM.
- qlora: as lora on backend=torch without tp, pp or cp, with DDP (zero 0/1) or FSDP2 (zero 2/3,
  no parameter offload: torchao's NF4Tensor implements FSDP2's all-gather hooks), every NF4
  weight a multiple of torchao NF4's 64 x 256 = 16,384 elements (its blocks and scaler blocks),
  under FSDP2 in equal row shards of whole such blocks.
"""

from __future__ import annotations

from launcher.backends.common import all_backends, backend_of
from launcher.config.adapters import ALL_LINEAR, NF4_BLOCK, NF4_SCALER_BLOCK, TARGET_WORDS
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig, ModelConfig
from launcher.plan.finetune import projections
from launcher.plan.model_shape import ModelShape

ERROR, WARNING = "error", "warning"
Problem = tuple[str, tuple[str, ...], str]


def _error(keys: tuple[str, ...], message: str) -> Problem:
    return (ERROR, keys, message)


def _warning(keys: tuple[str, ...], message: str) -> Problem:
    return (WARNING, keys, message)


def projection_dims(m: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of each target projection the model has (launcher.plan.finetune.projections)."""
    return {t: (p.fan_in, p.fan_out) for t, p in projections(m).items()}


def targets_of(cfg: LLMTrainConfig) -> list[str]:
    """The target words finetune.targets selects (all-linear: every projection the model has)."""
    targets = [str(t) for t in cfg.finetune.targets]
    dims = projection_dims(cfg.model)
    return list(dims) if ALL_LINEAR in targets else [t for t in targets if t in dims]


def finetune_values(cfg: LLMTrainConfig, layout: Layout) -> list[Problem]:
    ft = cfg.finetune
    if ft.name == "full":
        return []
    out: list[Problem] = []
    dims = projection_dims(cfg.model)
    targets = [str(t) for t in ft.targets]
    unknown = [t for t in targets if t not in TARGET_WORDS]
    absent = [t for t in targets if t in TARGET_WORDS and t != ALL_LINEAR and t not in dims]
    if not targets or unknown:
        out.append(
            _error(
                ("finetune.targets",),
                f"finetune.targets={targets}: {', '.join(unknown) or 'empty'} is not a "
                f"projection; choose from {', '.join(TARGET_WORDS)} (e.g. finetune.targets=[q,v])",
            )
        )
    if absent:
        out.append(
            _error(
                ("finetune.targets",),
                f"finetune.targets: {', '.join(absent)} not in this model (model.activation="
                f"{cfg.model.activation} has {', '.join(k for k in dims if k not in 'qkvo')}); "
                f"e.g. finetune.targets=[{','.join(dims)}]",
            )
        )
    # rank >= 1, alpha > 0 and dropout in [0, 1) are the schema's bounds (rule positive-values);
    # here, what depends on the model: a rank no larger than the smallest adapted dimension.
    chosen = targets_of(cfg)
    limit = min((min(dims[t]) for t in chosen), default=ft.rank)
    if ft.rank > limit:
        out.append(
            _error(
                ("finetune.rank",),
                f"finetune.rank={ft.rank} exceeds the smallest adapted dimension ({limit}); "
                f"a rank-{ft.rank} update of that projection is not low-rank: "
                f"finetune.rank={min(16, limit)}",
            )
        )
    if cfg.train.init_from is None:
        out.append(
            _warning(
                ("train.init_from",),
                f"finetune={ft.name} without train.init_from: the adapters train on a randomly "
                "initialised base (fine for a memory or speed check, not for fine-tuning)",
            )
        )
    return out


def _refuse(keys: tuple[str, ...], message: str) -> Problem:
    return _error(keys, message)


def finetune_layout(cfg: LLMTrainConfig, layout: Layout) -> list[Problem]:
    """The combinations the engines run with adapters (module docstring)."""
    ft, m, b = cfg.finetune, cfg.model, backend_of(cfg)
    if ft.name == "full":
        return []
    what = f"finetune={ft.name}"
    out: list[Problem] = []
    if m.num_experts:
        out.append(
            _refuse(
                ("finetune.name", "model.num_experts"),
                f"{what}: MoE experts are grouped-GEMM tensors, not adaptable linears; "
                "finetune=full trains this model",
            )
        )
    if m.kv_lora_rank is not None:
        out.append(
            _refuse(
                ("finetune.name", "model.kv_lora_rank"),
                f"{what}: multi-head latent attention's projections are not adaptable; "
                "finetune=full trains this model",
            )
        )
    if ft.name not in b.adapter_methods:
        able = [n for n, other in all_backends().items() if ft.name in other.adapter_methods]
        out.append(
            _refuse(
                ("finetune.name", "backend.name"),
                f"{what} is not run by backend={b.name}: backend={' or '.join(able)}",
            )
        )
    if cfg.precision.name == "fp8":
        out.append(
            _refuse(
                ("finetune.name", "precision.name"),
                f"{what}: fp8 layers are not adapted: precision=bf16",
            )
        )
    if b.adapters_with_model_parallel and layout.tp > 1:
        if cfg.parallel.sequence_parallel:
            out.append(
                _refuse(
                    ("finetune.name", "parallel.sequence_parallel"),
                    f"{what} with tensor parallel runs without sequence parallel: "
                    "parallel.sequence_parallel=false",
                )
            )
        kv = ModelShape(m).kv_heads
        if kv < layout.tp and {"k", "v"} & set(targets_of(cfg)):
            out.append(
                _refuse(
                    ("finetune.targets", "parallel.tp"),
                    f"{what}: {kv} kv heads < parallel.tp={layout.tp} replicates k and v, whose "
                    f"adapters that layout does not shard: parallel.tp={kv}, or "
                    "finetune.targets without k and v (e.g. [q,o,gate,up,down])",
                )
            )
    runs = ft.name in b.adapter_methods
    if runs and not b.adapters_with_model_parallel and (layout.tp > 1 or layout.pp > 1):
        out.append(
            _refuse(
                ("finetune.name", "parallel.tp" if layout.tp > 1 else "parallel.pp"),
                f"{what} on backend={b.name} runs data parallel only: parallel.tp=1 "
                "and parallel.pp=1, or backend=torch (tensor and pipeline parallel with adapters)",
            )
        )
    if ft.name == "qlora":
        out += _qlora(cfg, layout)
    return out


def _qlora(cfg: LLMTrainConfig, layout: Layout) -> list[Problem]:
    out: list[Problem] = []
    for key, value, fix in (
        ("parallel.tp", layout.tp, "parallel.tp=1"),
        ("parallel.pp", layout.pp, "parallel.pp=1"),
        ("parallel.cp", layout.cp, "parallel.cp=1"),
    ):
        if value > 1:
            out.append(
                _refuse(
                    ("finetune.name", key),
                    f"finetune=qlora keeps NF4 weights whole on each rank: {fix} "
                    "(or finetune=lora)",
                )
            )
    fsdp = cfg.zero.stage >= 2
    if fsdp and cfg.zero.offload_params != "none":
        out.append(
            _refuse(
                ("finetune.name", "zero.offload_params"),
                "finetune=qlora under FSDP2 keeps its NF4 shards on the device: "
                "zero.offload_params=none",
            )
        )
    out += _nf4_blocks(cfg, layout.dp if fsdp else 1)
    return out


def nf4_weights(cfg: LLMTrainConfig) -> list[str]:
    """The projections qlora stores in NF4: its targets, or with finetune.quantize=all-linear
    every projection of the blocks."""
    if cfg.finetune.quantize == ALL_LINEAR:
        return list(projection_dims(cfg.model))
    return targets_of(cfg)


def _nf4_blocks(cfg: LLMTrainConfig, shards: int) -> list[Problem]:
    """Every NF4 weight splits into whole NF4 blocks, and under FSDP2 (`shards` ranks) into
    equal row shards of whole scaler blocks: FSDP2 chunks dim 0 and torchao's NF4 ``aten.split``
    splits each inner tensor evenly (nf4_tensor.py, ``nf4_split``)."""
    dims = projection_dims(cfg.model)
    block = NF4_BLOCK * NF4_SCALER_BLOCK
    names = nf4_weights(cfg)
    key = "finetune.quantize" if cfg.finetune.quantize == ALL_LINEAR else "finetune.targets"
    bad = [t for t in names if (dims[t][0] * dims[t][1]) % block]
    if bad:
        return [
            _refuse(
                (key,),
                f"finetune=qlora: the {', '.join(bad)} weight(s) are not a multiple of NF4's "
                f"{NF4_BLOCK} x {NF4_SCALER_BLOCK} = {block} elements (torchao blocks and scaler "
                "blocks): leave them out of finetune.targets (finetune.quantize=targets) "
                "or finetune=lora",
            )
        ]
    uneven = [
        t for t in names if dims[t][1] % shards or (dims[t][0] * dims[t][1]) % (block * shards)
    ]
    if shards > 1 and uneven:
        return [
            _refuse(
                (key, "zero.stage"),
                f"finetune=qlora under FSDP2 shards each NF4 weight in {shards} equal row blocks "
                f"of whole {block}-element NF4 blocks; the {', '.join(uneven)} weight(s) do not "
                f"split so: fewer data-parallel ranks, zero.stage=0 (DDP) or leave them out",
            )
        ]
    return []


def finetune_problems(cfg: LLMTrainConfig, layout: Layout) -> list[Problem]:
    """Every problem of the values and the layout."""
    return finetune_values(cfg, layout) + finetune_layout(cfg, layout)


def engine_refusals(cfg: LLMTrainConfig) -> list[str]:
    """The errors, for the engines to refuse what validate refuses."""
    from launcher.config.layout import derive_layout

    if cfg.finetune.name == "full":  # no adapters, no problem (the search asks every layout)
        return []
    return [msg for sev, _, msg in finetune_problems(cfg, derive_layout(cfg)) if sev == ERROR]
