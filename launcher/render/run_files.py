"""The files of a run directory, rendered in memory by one function for every command that makes
or shows one: ``run`` and ``run --dry-run`` (mode ``local``), ``submit``, ``submit --dry-run`` and
``render --out DIR`` (mode ``slurm``). The same configuration, plan and place render the same
bytes, so what a dry run prints is what the command writes.

- ``local``: config.yaml, plan.json, launch.sh (one node: torchrun --standalone, or the trainer
  itself for one process; the exact command `run` starts) and the backend's own files
  (``Backend.artifacts``: ds_config.json, megatron_args.txt).
- ``slurm``: config.yaml, plan.json, launch.sh (every node: torchrun with c10d rendezvous),
  job.sbatch, hostfile (placeholder names; job.sbatch writes the real ones) and the backend's files.
  ``render`` also writes megatron_args.txt for the other backends (``translations``): the same
  layout as Megatron-LM arguments.

Pure: nothing here looks at this machine; the caller passes where the run lives (``Place``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from launcher.backends.common import backend_of
from launcher.config.composition.compose import Composed
from launcher.config.schema import LLMTrainConfig
from launcher.config.secrets import public_env, secret_names
from launcher.data.sources import MegatronData, megatron_data
from launcher.errors import UserError
from launcher.render.ds_config import render_ds_config
from launcher.render.hostfile import static_hostfile
from launcher.render.megatron_args import render_megatron_args
from launcher.render.megatron_launch import (
    entry_script,
    how_to_get_megatron,
    megatron_env,
    megatron_run_args,
)
from launcher.render.sbatch import RenderError, render_launch_sh, render_sbatch
from launcher.render.torchrun import (
    SINGLE_PROCESS_ENV,
    launch_script,
    single_process_command,
    torchrun_command,
)
from launcher.rundir import (
    CONFIG,
    DS_CONFIG,
    HOSTFILE,
    LAUNCH_SCRIPT,
    MEGATRON_ARGS,
    PLAN,
    SBATCH_SCRIPT,
)

LOCAL, SLURM = "local", "slurm"
MODES = (LOCAL, SLURM)
EXECUTABLE = (LAUNCH_SCRIPT, SBATCH_SCRIPT)
# Every file a run directory's renderer can produce (render removes those a render did not).
ARTIFACTS = (CONFIG, PLAN, DS_CONFIG, LAUNCH_SCRIPT, SBATCH_SCRIPT, HOSTFILE, MEGATRON_ARGS)


@dataclass(frozen=True)
class Place:
    """Where the run lives: its folder, the Python that runs the trainer, the working directory
    the scripts cd into; for mode local also this machine's CPU count (threads per rank on CPU)
    and the checkout of a backend whose ranks run its own script (None: not found); the run's
    name, which names its SLURM job (None: the folder's name; `render --out DIR` renders a run
    into a folder of another name)."""

    run_dir: str
    python: str
    workdir: str
    cpus: int = 1
    checkout: str | None = None
    run_name: str | None = None


@dataclass(frozen=True)
class LocalLaunch:
    """The command `run` starts and the environment it adds (launch.sh records both)."""

    command: list[str]
    env: dict[str, str]


def local_env(cfg: LLMTrainConfig, cpus: int) -> dict[str, str]:
    """Environment of the command of a local run (secrets left out: never written)."""
    nproc = cfg.cluster.gpus_per_node
    env = {"PYTHONUNBUFFERED": "1"}
    if cfg.cluster.gpu == "cpu":
        env["LLMTRAIN_DEVICE"] = "cpu"
        env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed otherwise prints a warning to stdout
        env["OMP_NUM_THREADS"] = str(max(1, cpus // nproc))
    env.update(public_env(cfg))
    return env


def local_launch(
    cfg: LLMTrainConfig, place: Place, data: MegatronData | None = None
) -> LocalLaunch:
    """torchrun on this machine: llmtrain's trainer on the run directory, or the backend's own
    script (``Backend.entry``) from its checkout with its arguments. One process of llmtrain's
    trainer starts without torchrun (``single_process_command``), with the environment torchrun
    would have given it."""
    env = local_env(cfg, place.cpus)
    worker: list[str] = []
    backend = backend_of(cfg)
    if backend.entry:
        if place.checkout is None:
            raise UserError(
                f"backend={backend.name}: no Megatron-LM checkout is named; {how_to_get_megatron()}"
            )
        env.update(megatron_env(cfg, place.checkout))
        worker = [entry_script(place.checkout), *megatron_run_args(cfg, place.run_dir, data)]
    nproc = cfg.cluster.gpus_per_node
    if nproc == 1 and not worker:
        env.update(SINGLE_PROCESS_ENV)
        return LocalLaunch(single_process_command(place.python, place.run_dir), env)
    return LocalLaunch(torchrun_command(place.python, nproc, place.run_dir, worker), env)


def _data(cfg: LLMTrainConfig) -> MegatronData:
    # Reads only dataset metadata (index.json, .idx headers) when the data is on this machine.
    return megatron_data(cfg.data.path, list(cfg.data.blend), cfg.data.valid_path)


Renderer = Callable[[LLMTrainConfig, Place, Callable[[], MegatronData]], str]
# How each file a backend names in ``Backend.artifacts`` is rendered.
BACKEND_FILES: dict[str, Renderer] = {
    DS_CONFIG: lambda cfg, place, data: render_ds_config(cfg),
    MEGATRON_ARGS: lambda cfg, place, data: render_megatron_args(cfg, data(), place.run_dir),
}


def plan_text(plan_doc: dict[str, Any]) -> str:
    return json.dumps(plan_doc, indent=2) + "\n"


def run_files(
    composed: Composed,
    plan_doc: dict[str, Any] | None,
    mode: str,
    place: Place,
    *,
    translations: bool = False,
) -> dict[str, str]:
    """{file name: text} of the run directory for `mode` (module docstring). `plan_doc`: the plan
    document (``launcher.plan.document.plan_to_json``); None leaves plan.json out. A value that
    cannot be written safely is a UserError naming its key (validate reports the same)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: one of {', '.join(MODES)}")
    cfg = composed.config
    backend = backend_of(cfg)
    cache: list[MegatronData] = []

    def data() -> MegatronData:
        if not cache:
            cache.append(_data(cfg))
        return cache[0]

    files = {CONFIG: yaml.safe_dump(composed.values, sort_keys=False)}
    if plan_doc is not None:
        files[PLAN] = plan_text(plan_doc)
    try:
        for name in backend.artifacts:
            files[name] = BACKEND_FILES[name](cfg, place, data)
        if mode == LOCAL:
            launch = local_launch(cfg, place, data() if backend.entry else None)
            files[LAUNCH_SCRIPT] = launch_script(
                launch.command, launch.env, place.workdir, secret_names(cfg)
            )
        else:
            where = {"python": place.python, "run_dir": place.run_dir, "workdir": place.workdir}
            files[LAUNCH_SCRIPT] = render_launch_sh(cfg, **where)
            files[SBATCH_SCRIPT] = render_sbatch(cfg, **where, run_name=place.run_name)
            files[HOSTFILE] = static_hostfile(cfg)
    except RenderError as exc:
        raise UserError(str(exc)) from None
    if translations and MEGATRON_ARGS not in files:
        files[MEGATRON_ARGS] = BACKEND_FILES[MEGATRON_ARGS](cfg, place, data)
    return dict(sorted(files.items(), key=lambda item: ARTIFACTS.index(item[0])))
