"""The rules on the rest of the configuration: precision-hardware (dtypes the GPU runs),
backend-capabilities (the backend's table), script-values (what the run's scripts can hold),
data-sources, run-name, optimizer-values, chat-data, finetune and preference. Plain functions
``(cfg, layout) -> list[Violation]``: none reads a value the layout search varies, except through
the backend's table, which the search asks itself (``backends.raw_refusals``).
"""

from __future__ import annotations

import math
from pathlib import PurePosixPath

from launcher.backends import refusals
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.config.script_values import script_problems
from launcher.excerpt import excerpt
from launcher.rundir import MAX_RUN_NAME_BYTES
from launcher.validate.build_rules import build_memory
from launcher.validate.chat_rules import chat_problems
from launcher.validate.finetune_rules import finetune_problems
from launcher.validate.preference_rules import preference_problems
from launcher.validate.rule import RuleFn, Violation, error, warning


def precision_hardware(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    from launcher.plan.hardware.lookup import UnknownGPUError, cluster_gpu, missing_custom_keys

    prec, gpu_key = cfg.precision, cfg.cluster.gpu
    missing = missing_custom_keys(cfg.cluster)
    if missing:
        return [
            error(
                "precision-hardware",
                ("cluster.gpu", *missing),
                f"cluster.gpu=custom describes the GPU by keys; set {', '.join(missing)} (e.g. "
                "cluster.gpu_memory_gib=24 cluster.gpu_bf16_tflops=165 "
                "cluster.gpu_memory_gbps=1008 for an RTX 4090), or name a catalog GPU",
            )
        ]
    try:
        gpu = cluster_gpu(cfg.cluster)
    except UnknownGPUError as exc:
        return [error("precision-hardware", ("cluster.gpu",), str(exc))]
    out = []
    uses_bf16 = "bf16" in (prec.compute_dtype, prec.grad_dtype)
    if uses_bf16 and not gpu.supports_bf16:
        out.append(
            error(
                "precision-hardware",
                ("precision", "cluster.gpu"),
                f"precision={prec.name} computes in bf16, which {gpu.name} ({gpu.arch}) does not "
                "support (needs Ampere or newer); use precision=fp16 or precision=fp32",
            )
        )
    if prec.fp8_emulate and not prec.fp8:
        out.append(
            warning(
                "precision-hardware",
                ("precision.fp8_emulate",),
                f"precision.fp8_emulate=true has no effect with precision={prec.name}; use "
                "precision=fp8 with it, or drop it",
            )
        )
    # fp8 on CPU is the backend table's to refuse (launcher/backends/: emulation runs there).
    if prec.fp8 and not gpu.supports_fp8 and not prec.fp8_emulate and gpu.arch != "cpu":
        out.append(
            error(
                "precision-hardware",
                ("precision", "cluster.gpu"),
                f"precision=fp8 needs fp8 tensor cores (compute capability 8.9+: Ada, Hopper or "
                f"newer); cluster.gpu={gpu_key} ({gpu.name}, {gpu.arch}) has none; use "
                "precision=bf16, a GPU with fp8 (e.g. cluster=h100-80gb), or "
                "precision.fp8_emulate=true (emulated fp8 matmuls: numerics only, no speedup)",
            )
        )
    # Transformer Engine's check_mxfp8_support (transformer_engine/pytorch/fp8.py): "Device
    # compute capability 10.0 or higher required for MXFP8 execution" (Blackwell and newer).
    if cfg.backend.fp8_scaling == "mxfp8" and gpu.arch not in ("blackwell", "cpu"):
        out.append(
            error(
                "precision-hardware",
                ("backend.fp8_scaling", "cluster.gpu"),
                f"backend.fp8_scaling=mxfp8 needs Blackwell tensor cores (compute capability "
                f"10.0+); cluster.gpu={gpu_key} ({gpu.name}, {gpu.arch}) has none; use "
                "backend.fp8_scaling=tensorwise, or a Blackwell GPU (e.g. cluster=b200)",
            )
        )
    if "fp16" in (prec.compute_dtype, prec.grad_dtype) and prec.loss_scaling == "none":
        out.append(
            error(
                "precision-hardware",
                ("precision.loss_scaling",),
                "fp16 training needs loss scaling (gradients underflow otherwise); set "
                "precision.loss_scaling=dynamic",
            )
        )
    return out


# What each backend can run is declared in launcher/backends/ (one table per engine); this rule
# reports that table's refusals for the configured backend.
def backend_capabilities(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    return [error("backend-capabilities", ("backend", *r.keys), r.message) for r in refusals(cfg)]


# Values the run's scripts cannot hold (control characters, environment names, sbatch options,
# secrets kept from the job, unmountable paths): the renderers refuse the same, as an invariant.
def script_values(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    run_dir = str(PurePosixPath(cfg.run.root_dir) / (cfg.run.name or "RUN"))
    return [error("script-values", p.keys, p.message) for p in script_problems(cfg, run_dir)]


# Files are checked before launch (launcher.launch.preflight.data_problems); here only the shape.
def data_sources(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    d, t = cfg.data, cfg.train
    out = []
    example = "[0.7,/data/a_text_document,0.3,/data/b_text_document]"
    if d.blend and d.path is not None:
        out.append(
            error(
                "data-sources",
                ("data.path", "data.blend"),
                f"data.path={d.path} and data.blend are both set: give one (data.path=null)",
            )
        )
    if d.blend and len(d.blend) % 2:
        out.append(
            error(
                "data-sources",
                ("data.blend",),
                f"data.blend has {len(d.blend)} values: expected weight, path pairs, e.g. "
                f"data.blend={example}",
            )
        )
    for i in range(0, len(d.blend) - 1, 2):
        weight, path = d.blend[i], d.blend[i + 1]
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            out.append(
                error(
                    "data-sources",
                    ("data.blend",),
                    f"data.blend[{i}]={weight!r}: a weight must be a number > 0, e.g. "
                    f"data.blend={example}",
                )
            )
        if not isinstance(path, str) or not path:
            out.append(
                error(
                    "data-sources",
                    ("data.blend",),
                    f"data.blend[{i + 1}]={path!r}: expected a dataset path (a prepared folder "
                    "or a Megatron PREFIX)",
                )
            )
    if t.eval_every is not None and t.eval_every < 0:
        out.append(
            error(
                "data-sources",
                ("train.eval_every",),
                f"train.eval_every={t.eval_every}: must be >= 0 (0 or null: no evaluation), "
                "e.g. train.eval_every=100",
            )
        )
    return out


def run_name_problem(name: object) -> str | None:
    """What is wrong with run.name as a run directory's folder name (None: fine). `run`,
    `--dry-run` and `validate` all use it (launcher.launch.local names the folder): a plain
    name, UTF-8 text without C1 control characters (C0 ones are the script-values rule's), at
    most MAX_RUN_NAME_BYTES bytes so that every folder llmtrain names after it (--fresh's
    NAME-YYYYmmdd-HHMMSS) fits the file system's 255-byte names."""
    if name is None:
        return None
    text = str(name)
    if "/" in text or "\0" in text or text in ("", ".", ".."):
        return (
            f"run.name={excerpt(text)}: must be a plain folder name (no '/', not '.' or '..'), "
            "e.g. exp1"
        )
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # bytes that are not UTF-8 arrive as lone surrogates
        return f"run.name={excerpt(text)}: not UTF-8 text; give a plain folder name, e.g. exp1"
    if any("\x80" <= ch <= "\x9f" for ch in text):
        return (
            f"run.name={excerpt(text)}: C1 control characters (which terminals obey) are not "
            "allowed; give a plain folder name, e.g. exp1"
        )
    if size > MAX_RUN_NAME_BYTES:
        return (
            f"run.name={excerpt(text)}: {size} bytes long; at most {MAX_RUN_NAME_BYTES} (file "
            f"names hold 255 bytes, and --fresh adds -YYYYmmdd-HHMMSS), e.g. {excerpt(text[:40])}"
        )
    return None


def run_name(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    problem = run_name_problem(cfg.run.name)
    return [error("run-name", ("run.name",), problem)] if problem else []


# Adam-family rates above this diverge on any model size (published runs use 1e-4..1e-2).
HOT_LR = 1.0


def optimizer_values(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    """Legal but suspicious optimizer settings: warnings (the hard limits are in
    positive-values)."""
    o, out = cfg.optim, []
    if o.name in ("adam", "adamw", "lion") and math.isfinite(o.lr) and o.lr > HOT_LR:
        out.append(
            warning(
                "optimizer-values",
                ("optim.lr",),
                f"optim.lr={o.lr:g} with {o.name}: far above the usual 1e-4..1e-2; such a run "
                "usually diverges (it then stops with exit 3 at the first non-finite step)",
            )
        )
    steps = layout.steps
    if isinstance(steps, int) and 0 < steps < o.warmup_steps:
        out.append(
            warning(
                "optimizer-values",
                ("optim.warmup_steps",),
                f"optim.warmup_steps={o.warmup_steps} > {steps} training steps: the learning "
                f"rate never reaches optim.lr={o.lr:g}; e.g. optim.warmup_steps={steps // 10}",
            )
        )
    return out


# Fine-tuning data (data.builtin=chat and its layout): launcher/validate/chat_rules.py.
def chat_data(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    return [error("chat-data", keys, message) for keys, message in chat_problems(cfg, layout)]


# finetune=lora|qlora: values, targets and the layouts the engines run (their own module).
def finetune(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    return [Violation("finetune", s, k, m) for s, k, m in finetune_problems(cfg, layout)]


# finetune.objective=dpo|simpo|orpo: objective, data, reference and layout (their own module).
def preference(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    return [Violation("preference", s, k, m) for s, k, m in preference_problems(cfg, layout)]


# In the order `check()` reports them (after the layout rules).
CONFIG_RULES: dict[str, RuleFn] = {
    "precision-hardware": precision_hardware,
    "backend-capabilities": backend_capabilities,
    "script-values": script_values,
    "data-sources": data_sources,
    "run-name": run_name,
    "optimizer-values": optimizer_values,
    "chat-data": chat_data,
    "finetune": finetune,
    "build-memory": build_memory,
    "preference": preference,
}
