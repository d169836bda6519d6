"""The rules of preference training (finetune.objective=dpo|simpo|orpo; docs/finetuning.md), rule
"preference" in ``launcher.validate.rules``: what the configuration alone says cannot run. A
preference dataset named by data.path is checked against the objective before launch, from its
index (``launcher.data.chat.chat_checks.preference_problems``). Never imports torch.

What runs (tests/unit/train/finetune/test_preference_engine.py, tests/integration/test_tiny_dpo.py):
backend=torch with one process, DDP, ZeRO-1, FSDP2 (zero 2/3) and tensor parallel;
backend=deepspeed with ZeRO 0-3 and no tp/pp; finetune=full|lora|qlora as each of those runs it.
Refused, each with a value that works: pipeline parallel (the schedules take one loss over
micro-batches of single sequences), context parallel (each rank would hold part of a response's
log-probability), expert parallel, Megatron-LM, packing (a pair is one padded sequence a row each),
the adapters-off reference without adapters, a reference copy with adapters, a precomputed
reference with evaluation.
"""

from __future__ import annotations

from launcher.backends.common import backend_of
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.preference import is_preference, reference_mode

Problem = tuple[str, tuple[str, ...], str]
ERROR, WARNING = "error", "warning"
# The built-in pairs' vocabulary (the chat data's byte-level ChatML tokenizer, 259 tokens).
BUILTIN_VOCAB = 259


def _layout(cfg: LLMTrainConfig, layout: Layout) -> list[Problem]:
    what = f"finetune.objective={cfg.finetune.objective}"
    out: list[Problem] = []
    backend = backend_of(cfg).name
    if backend == "megatron":
        out.append(
            (
                ERROR,
                ("finetune.objective", "backend.name"),
                f"{what} is not run by backend=megatron: backend=torch",
            )
        )
    for key, value, why in (
        (
            "parallel.pp",
            layout.pp,
            "the pipeline schedules compute one loss per micro-batch of "
            "single sequences, not of pairs",
        ),
        ("parallel.cp", layout.cp, "each rank would hold part of a response's log-probability"),
        ("parallel.ep", layout.ep, "not run with expert parallel"),
    ):
        if value > 1:
            out.append(
                (
                    ERROR,
                    (key, "finetune.objective"),
                    f"{what} with {key}={value}: {why}; set {key}=1",
                )
            )
    if backend == "deepspeed" and layout.tp > 1:
        out.append(
            (
                ERROR,
                ("parallel.tp", "finetune.objective"),
                f"{what} on backend=deepspeed runs data parallel only (ZeRO 0-3): "
                "parallel.tp=1, or backend=torch (tensor parallel)",
            )
        )
    return out


def _reference(cfg: LLMTrainConfig) -> list[Problem]:
    ft = cfg.finetune
    mode = reference_mode(cfg)
    out: list[Problem] = []
    if ft.objective != "dpo" and ft.reference != "auto":
        out.append(
            (
                WARNING,
                ("finetune.reference",),
                f"finetune.reference={ft.reference} is not read: finetune.objective="
                f"{ft.objective} uses no reference model",
            )
        )
    if mode == "adapters-off" and ft.name == "full":
        out.append(
            (
                ERROR,
                ("finetune.reference", "finetune.name"),
                "finetune.reference=adapters-off needs adapters to switch off "
                "(finetune=lora or qlora); with finetune=full use "
                "finetune.reference=precomputed",
            )
        )
    if mode == "copy" and ft.name != "full":
        out.append(
            (
                ERROR,
                ("finetune.reference", "finetune.name"),
                f"finetune.reference=copy builds a second model for finetune=full; with "
                f"finetune={ft.name} the reference is the same model with its adapters off, "
                "no copy: finetune.reference=adapters-off (or auto)",
            )
        )
    if mode == "precomputed" and cfg.train.eval_every:
        other = "adapters-off" if ft.name != "full" else "copy"
        picked = (
            " (finetune.reference=auto picks precomputed with finetune=full)"
            if ft.reference == "auto"
            else ""
        )
        out.append(
            (
                ERROR,
                ("train.eval_every", "finetune.reference"),
                f"train.eval_every={cfg.train.eval_every} with a precomputed reference{picked}: "
                "the reference pass covers the training pairs only; train.eval_every=0, or "
                f"finetune.reference={other}",
            )
        )
    if ft.objective == "dpo" and ft.loss_type == "ipo" and ft.label_smoothing > 0:
        out.append(
            (
                ERROR,
                ("finetune.label_smoothing", "finetune.loss_type"),
                f"finetune.label_smoothing={ft.label_smoothing:g} applies to the sigmoid "
                "loss, not loss_type=ipo: finetune.label_smoothing=0",
            )
        )
    return out


def _data(cfg: LLMTrainConfig) -> list[Problem]:
    d, ft = cfg.data, cfg.finetune
    out: list[Problem] = []
    builtin = d.path is None and not d.blend
    if is_preference(cfg) and d.blend:
        out.append(
            (
                ERROR,
                ("data.blend", "finetune.objective"),
                f"finetune.objective={ft.objective} reads one preference dataset: "
                "data.path=FOLDER (data prepare --input-format preference), not "
                "data.blend",
            )
        )
    if is_preference(cfg) and builtin and d.builtin != "preference":
        out.append(
            (
                ERROR,
                ("data.builtin", "finetune.objective"),
                f"finetune.objective={ft.objective} trains on preference pairs, not "
                f"data.builtin={d.builtin}: data.builtin=preference, or data.path=FOLDER "
                "(data prepare --input-format preference)",
            )
        )
    if not builtin or d.builtin != "preference":
        return out
    if not is_preference(cfg):
        out.append(
            (
                ERROR,
                ("finetune.objective", "data.builtin"),
                "data.builtin=preference holds pairs for finetune.objective=dpo, simpo or "
                "orpo: finetune.objective=dpo (or data.builtin=chat for sft)",
            )
        )
    if d.packing:
        from launcher.data.chat.preference_rows import packing_message  # numpy: not at start-up

        out.append((ERROR, ("data.packing",), packing_message("data.builtin=preference")))
    if cfg.model.vocab_size < BUILTIN_VOCAB:
        out.append(
            (
                ERROR,
                ("model.vocab_size",),
                f"model.vocab_size={cfg.model.vocab_size}: the built-in pairs' tokenizer has "
                f"{BUILTIN_VOCAB} tokens: model.vocab_size={BUILTIN_VOCAB} or more",
            )
        )
    return out


def preference_problems(cfg: LLMTrainConfig, layout: Layout) -> list[Problem]:
    """(severity, keys, message) of each problem (module docstring)."""
    out = _data(cfg)
    if is_preference(cfg):
        out += _layout(cfg, layout) + _reference(cfg)
    return out


def engine_refusals(cfg: LLMTrainConfig) -> list[str]:
    """The errors, for the engines to refuse what validate refuses."""
    from launcher.config.layout import derive_layout

    return [m for s, _, m in preference_problems(cfg, derive_layout(cfg)) if s == ERROR]
