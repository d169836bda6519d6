"""Everything checked before a run starts a process: no half-made run directory on bad input.

``preflight(cfg)`` returns the plan and raises ``UserError`` (exit 2) listing every problem: the
validation rules' errors (what the chosen backend cannot run among them, from launcher/backends/),
a backend that is plan/render-only here, backend=megatron without a Megatron-LM checkout, fp8
without torchao installed, a predicted memory overflow (with the planner's smallest fixes;
``force`` skips only this one), missing data, and hardware this machine does not have.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

from launcher.backends import launch_refusal
from launcher.backends.common import backend_of, precision_of
from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.plan.planner import Plan, make_plan
from launcher.train.reporting.trackers import problems as tracker_problems
from launcher.validate.rules import check, passes


def backend_problems(cfg: LLMTrainConfig) -> list[str]:
    """Why `run`/`submit` cannot train with the configured backend here (launcher/backends/: the
    capability refusals themselves are validation errors, see ``validate.rules``)."""
    refusal = launch_refusal(cfg)
    return [refusal] if refusal else []


def megatron_root(cfg: LLMTrainConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The Megatron-LM checkout of backend=megatron: backend.megatron_path, else
    $MEGATRON_LM_PATH (absolute, user folder expanded); None when neither is set."""
    from launcher.render.megatron_launch import ENV_VAR

    environ = os.environ if environ is None else environ
    given = cfg.backend.megatron_path or environ.get(ENV_VAR) or None
    return str(Path(given).expanduser().resolve()) if given else None


def megatron_problems(cfg: LLMTrainConfig, *, local: bool) -> list[str]:
    """backend=megatron needs Megatron-LM's pretrain_gpt.py. A job in slurm.container_image may
    hold the checkout only inside the image, so there it is only required to be named."""
    from launcher.render.megatron_launch import DATA_ARGS, ENTRY, ENV_VAR, how_to_get_megatron

    if not backend_of(cfg).entry:  # the ranks run llmtrain's trainer, no checkout needed
        return []
    problems = []
    extra = {word.split("=", 1)[0] for word in cfg.backend.megatron_extra_args}
    if not extra & set(DATA_ARGS):
        # Data in llmtrain's shard format: Megatron-LM would not read it (and must not fall back
        # to --mock-data while data.path names real data).
        from launcher.data.sources import megatron_data

        data = megatron_data(cfg.data.path, list(cfg.data.blend), cfg.data.valid_path)
        problems += [
            f"{note}; or give Megatron-LM its data with backend.megatron_extra_args="
            "[--data-path,PREFIX]"
            for note in data.notes
        ]
    root = megatron_root(cfg)
    if root is None:
        problems.append(
            f"backend=megatron: no Megatron-LM checkout is named; {how_to_get_megatron()}"
        )
    elif (local or cfg.slurm.container_image is None) and not (Path(root) / ENTRY).is_file():
        key = "backend.megatron_path" if cfg.backend.megatron_path else ENV_VAR
        problems.append(
            f"{key}={root}: no {ENTRY} there (Megatron-LM's training script sits at the root "
            f"of its checkout); {how_to_get_megatron()}"
        )
    return problems


def fp8_problems(cfg: LLMTrainConfig, *, local: bool) -> list[str]:
    """backend=torch precision=fp8 trains with torchao's float8 layers: torchao must be
    installed where the ranks run (looked up, not imported: importing it imports torch). A job
    in slurm.container_image brings its own packages."""
    package = backend_of(cfg).fp8_package
    if not package or precision_of(cfg) != "fp8":
        return []
    if not local and cfg.slurm.container_image is not None:
        return []
    if importlib.util.find_spec(package) is None:
        return [
            "precision=fp8 with backend=torch needs torchao (float8 training) in this Python "
            "environment: pip install 'llmtrain[fp8]' (torchao==0.18.0), or use precision=bf16"
        ]
    return []


def hardware_problems(cfg: LLMTrainConfig) -> list[str]:
    """A local run needs the devices it names on this machine."""
    c = cfg.cluster
    if c.num_nodes > 1:
        return [
            f"cluster.num_nodes={c.num_nodes}: a local run uses this machine only; use "
            "cluster.num_nodes=1, or `llmtrain submit` to run on a SLURM cluster"
        ]
    if c.gpu == "cpu":
        cores = os.cpu_count() or 1
        if c.gpus_per_node > 4 * cores:
            return [
                f"cluster.gpus_per_node={c.gpus_per_node} CPU processes on {cores} cores would "
                f"crawl; use at most {4 * cores}"
            ]
        return []
    visible = _cuda_device_count()
    if visible < c.gpus_per_node:
        fewer = (
            f"cluster.gpus_per_node={visible} (the GPUs found, if they are free), "
            if visible
            else ""
        )
        return [
            f"cluster={c.name} needs {c.gpus_per_node} CUDA GPUs on this machine, found "
            f"{visible}; use cluster=cpu (CPU processes, e.g. cluster.gpus_per_node=2), "
            f"{fewer}or `llmtrain submit`"
        ]
    return []


def _cuda_device_count() -> int:
    """CUDA devices without importing torch (nvidia-smi's device files)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len(list(Path("/dev").glob("nvidia[0-9]*")))


def data_problems(cfg: LLMTrainConfig) -> list[str]:
    if cfg.data.path is None and not cfg.data.blend:
        if cfg.data.tokenizer != "byte":
            return [
                "data.tokenizer=bpe needs prepared data: run `llmtrain data prepare --input TEXT "
                "--output DIR --tokenizer bpe` and set data.path=DIR"
            ]
        if cfg.model.vocab_size < 256:
            return [
                f"model.vocab_size={cfg.model.vocab_size}: the built-in corpus is byte-level "
                "(256 symbols); use model.vocab_size=256 or more"
            ]
    from launcher.data.chat.chat_checks import chat_problems
    from launcher.data.sources import source_problems

    d = cfg.data
    lay = derive_layout(cfg)
    try:
        chat = chat_problems(cfg, lay.global_batch_size, lay.pp, lay.cp)
    except UserError as exc:
        chat = [str(exc)]
    if d.path is None and not d.blend and d.builtin in ("chat", "preference"):
        return chat  # the built-in chat data and pairs (rule chat-data) have a validation split
    try:
        return chat + source_problems(
            d.path,
            list(d.blend),
            d.valid_path,
            cfg.model.vocab_size,
            cfg.model.seq_length,
            derive_layout(cfg).global_batch_size,
            cfg.train.eval_every,
        )
    except UserError as exc:
        return [str(exc)]


def launch_problems(cfg: LLMTrainConfig, plan: Plan, *, local: bool, force: bool) -> list[str]:
    """Why `run` (local=True) or `submit` (local=False) would refuse a configuration that passes
    validation: a plan/render-only backend, this machine's hardware (run only), missing data, a
    predicted memory overflow (unless `force`), a budget without an optimizer step."""
    problems = (
        backend_problems(cfg)
        + megatron_problems(cfg, local=local)
        + fp8_problems(cfg, local=local)
        + (hardware_problems(cfg) if local else [])
        + data_problems(cfg)
    )
    if not plan.memory.fits and not force:
        fixes = [f"{fix.line} -> {fix.device_bytes / 2**30:.1f} GiB" for fix in plan.fixes]
        need = plan.memory.heaviest.device_total / 2**30
        have = plan.memory.usable / 2**30
        problems.append(
            f"predicted memory per device {need:.1f} GiB does not fit {have:.1f} GiB "
            f"({cfg.cluster.gpu}, with headroom); "
            + ("smallest changes that fit: " + "; ".join(fixes) if fixes else "no change found")
            + ". Pass --force to launch anyway."
        )
    if derive_layout(cfg).steps < 1:
        problems.append("train.steps (or train.tokens) gives no optimizer step; set train.steps")
    if (
        cfg.model.qk_norm
    ):  # plan prices it; the training model (launcher/train/model/transformer.py) has none
        problems.append(
            "model.qk_norm=true (Qwen3's q/k RMSNorm): llmtrain's training model has no q/k norm; "
            "plan and validate price it, run and submit refuse it"
        )
    problems += tracker_problems(cfg)
    if cfg.train.init_from is not None:  # reads the weights' shapes (imports torch)
        from launcher.train.checkpoint.init_from import problems as init_from_problems

        problems += init_from_problems(cfg)
    return problems


def preflight(cfg: LLMTrainConfig, force: bool = False, local: bool = True) -> Plan:
    """`local=False` (a SLURM submission) skips the checks of this machine's own hardware."""
    problems = [v.message for v in check(cfg) if v.is_error]
    if problems:
        raise UserError("the configuration is invalid:\n- " + "\n- ".join(problems))
    plan = make_plan(cfg, accept=passes)
    problems = launch_problems(cfg, plan, local=local, force=force)
    if problems:
        raise UserError("cannot run this configuration:\n- " + "\n- ".join(problems))
    return plan
