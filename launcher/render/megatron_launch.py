"""What `llmtrain run` / `submit` start for backend=megatron: Megatron-LM's own ``pretrain_gpt.py``
under torchrun (local) or srun + torchrun (SLURM), with the arguments of
``launcher.render.megatron_args`` plus the run's own (checkpoints in the run directory, data).

Megatron-LM is the user's checkout (``backend.megatron_path``, else ``$MEGATRON_LM_PATH``): its
root holds ``pretrain_gpt.py`` and the ``megatron`` package, so the ranks get it on PYTHONPATH.
The ``megatron-core`` package on PyPI carries ``megatron/core`` only (checked for 0.16.1: no
``megatron/training``, no ``pretrain_gpt.py``), so it cannot stand in for the checkout.
Environment, from Megatron-LM's docs: ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor parallel (it
orders the tensor-parallel communication kernels before the GEMMs they overlap with).

Pure functions: the scripts name ``$MEGATRON_LM_PATH`` when the config gives no path, and the
caller that launches resolves it (``launcher.launch.preflight.megatron_root``).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from launcher.backends.megatron import BACKEND as MEGATRON
from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.data.sources import MegatronData, megatron_data
from launcher.render.megatron_args import megatron_args

ENV_VAR = "MEGATRON_LM_PATH"
ENTRY = MEGATRON.entry  # pretrain_gpt.py
# The Megatron-LM release whose argument names megatron_args.py follows (megatron-core 0.16.1).
RELEASE = "core_v0.16.1"
# Arguments that say where the data comes from; without any of them the run uses --mock-data.
DATA_ARGS = (
    "--data-path",
    "--mock-data",
    "--train-data-path",
    "--data-args-path",
    "--per-split-data-args-path",
)


def how_to_get_megatron() -> str:
    """What to do when no Megatron-LM checkout is found (ends a refusal)."""
    return (
        f"set backend.megatron_path=/path/to/Megatron-LM (or export {ENV_VAR}) to a Megatron-LM "
        f"checkout holding {ENTRY}: `git clone --branch {RELEASE} "
        "https://github.com/NVIDIA/Megatron-LM.git` and, in it, `pip install --no-build-isolation "
        "-e .[mlm]` (or use an NGC PyTorch container); `pip install megatron-core` alone is not "
        f"enough, it has no {ENTRY}"
    )


def megatron_env(cfg: LLMTrainConfig, root: str) -> dict[str, str]:
    """Environment of the Megatron-LM ranks (besides llmtrain's own, see sbatch.job_env)."""
    return {"PYTHONPATH": root, **MEGATRON.env(cfg)}


def entry_script(root: str) -> str:
    return str(PurePosixPath(root) / ENTRY)


def megatron_run_args(
    cfg: LLMTrainConfig, run_dir: str, data: MegatronData | None = None
) -> list[str]:
    """All arguments of pretrain_gpt.py for a run in `run_dir`: megatron_args.txt's for this run
    (its data resolved as `render` does: --data-path / --train-data-path and the tokenizer of a
    prepared dataset, else --mock-data; --save/--load RUN_DIR/checkpoints), the checkpoint
    interval (checkpoint.every_steps, else the last step), then backend.megatron_extra_args (last,
    so they win; when they name data, the rendered --mock-data is dropped). `data`: the run's
    data already resolved by the caller (else resolved here)."""
    extra = list(cfg.backend.megatron_extra_args)
    if data is None:
        data = megatron_data(cfg.data.path, list(cfg.data.blend), cfg.data.valid_path)
    interval = cfg.checkpoint.every_steps or derive_layout(cfg).steps
    args = [*megatron_args(cfg, data, run_dir), "--save-interval", str(max(1, interval))]
    named = {word.split("=", 1)[0] for word in extra}
    if named & set(DATA_ARGS):
        args = [a for a in args if a != "--mock-data"]
    return args + extra
