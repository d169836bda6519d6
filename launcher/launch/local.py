"""`llmtrain run`: make the run directory and train on this machine under torchrun.

The run directory (``run.root_dir``/NAME) holds everything about a run::

    config.yaml     the resolved configuration the ranks train from
    plan.json       `llmtrain plan --json` for it (predictions the summary compares against)
    ds_config.json  the DeepSpeed config (backend=deepspeed)
    launch.sh       the exact torchrun command and environment that was launched
    logs/           rank{R}.log per rank, torchrun.log, rank{R}.error.json for a failed rank
    metrics.jsonl   one line per step;  tensorboard/  the same as TensorBoard events
    checkpoints/    step_NNNNNNNN/ (see launcher.train.checkpoint);  summary.json at the end

NAME is ``run.name`` or ``<recipe>-<hash of the config>``: running the same command again finds
the same folder and resumes from its latest valid checkpoint (the hash leaves out what does not
change the training itself: the run length, checkpoint cadence, logging and launcher settings).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from launcher.config.compose import Composed
from launcher.config.schema import LLMTrainConfig
from launcher.config.secrets import public_env, secret_env, secret_names
from launcher.errors import UserError
from launcher.render.torchrun import launch_script, torchrun_command
from launcher.train.checkpoint import PREEMPTED_MARKER

# Keys that do not change what is trained, so a changed value still resumes the same run.
_NOT_IN_NAME = (
    "run",
    "checkpoint",
    "launcher",
    "slurm",
    "train.steps",
    "train.tokens",
    "train.log_every",
)


class RunFailed(Exception):
    """A rank failed; the message names it and its error. Exit code 1."""

    exit_code = 1


class RunPreempted(Exception):
    """The run checkpointed and stopped on SIGUSR1/SIGTERM. Exit code 99 (resume to continue)."""

    exit_code = 99


def config_digest(values: dict[str, Any]) -> str:
    trimmed = json.loads(json.dumps(values))
    for key in _NOT_IN_NAME:
        node = trimmed
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.get(part, {})
        node.pop(leaf, None)
    return hashlib.sha256(json.dumps(trimmed, sort_keys=True).encode()).hexdigest()[:8]


def run_dir_for(composed: Composed) -> Path:
    cfg = composed.config
    name = cfg.run.name or f"{cfg.recipe}-{config_digest(composed.values)}"
    if "/" in name or name in ("", ".", ".."):
        raise UserError(f"run.name={name!r}: must be a plain folder name (no '/')")
    return Path(cfg.run.root_dir).expanduser() / name


@dataclass(frozen=True)
class Prepared:
    run_dir: Path
    command: list[str]
    # Written into launch.sh; the secrets are only ever handed to the torchrun process.
    env: dict[str, str]
    secrets: dict[str, str] = field(default_factory=dict, repr=False)


def worker_env(cfg: LLMTrainConfig, nproc: int) -> dict[str, str]:
    env = {"PYTHONUNBUFFERED": "1"}
    if cfg.cluster.gpu == "cpu":
        env["LLMTRAIN_DEVICE"] = "cpu"
        env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed otherwise prints a warning to stdout
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    env.update(public_env(cfg))
    return env


def prepare_run_dir(composed: Composed, plan_json: dict[str, Any], fresh: bool) -> Prepared:
    """Write the run directory's config and artifacts (a run dir that exists is reused)."""
    cfg = composed.config
    secrets = secret_env(cfg, os.environ)  # a missing secret stops here, before any write
    run_dir = run_dir_for(composed)
    if fresh and run_dir.exists():
        run_dir = run_dir.with_name(f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    run_dir = run_dir.resolve()
    _write(run_dir / "config.yaml", yaml.safe_dump(composed.values, sort_keys=False))
    _write(run_dir / "plan.json", json.dumps(plan_json, indent=2) + "\n")
    if cfg.backend.name == "deepspeed":
        from launcher.render.ds_config import render_ds_config

        _write(run_dir / "ds_config.json", render_ds_config(cfg))
    nproc = cfg.cluster.gpus_per_node
    command = torchrun_command(sys.executable, nproc, str(run_dir))
    env = worker_env(cfg, nproc)
    script = launch_script(command, env, os.getcwd(), secret_names(cfg))
    _write(run_dir / "launch.sh", script)
    os.chmod(run_dir / "launch.sh", 0o755)
    return Prepared(run_dir=run_dir, command=command, env=env, secrets=secrets)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def launch(prepared: Prepared) -> None:
    """Run torchrun and wait. Raises RunFailed with the failing rank's error, or RunPreempted."""
    env = {**os.environ, **prepared.env, **prepared.secrets}
    log = open(prepared.run_dir / "logs" / "torchrun.log", "ab")  # noqa: SIM115
    started = time.time()
    # torchrun's own messages (and rank 0's stderr) go to the log; rank 0's stdout (progress,
    # summary) comes to this terminal. torchrun tears every rank down when one fails.
    process = subprocess.Popen(prepared.command, env=env, stderr=log, start_new_session=True)

    def forward(signum: int, frame: object) -> None:
        process.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        code = process.wait()
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        code = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.close()
    if code == 0:
        return
    marker = prepared.run_dir / PREEMPTED_MARKER
    if marker.is_file() and marker.stat().st_mtime >= started:
        raise RunPreempted(
            f"preempted: checkpoint written in {prepared.run_dir / 'checkpoints'}; run the same "
            "command again to resume"
        )
    errors = rank_errors(prepared.run_dir, since=started)
    if errors:
        first = errors[0]
        rank_log = prepared.run_dir / "logs" / f"rank{first['rank']}.log"
        raise RunFailed(
            f"rank {first['rank']} failed: {first['type']}: {first['message']}\n"
            f"(traceback in {rank_log}; "
            f"every rank was stopped)"
        )
    raise RunFailed(
        f"torchrun exited with code {code} and no rank reported an error (killed by a signal?); "
        f"see {prepared.run_dir / 'logs' / 'torchrun.log'}"
    )


def rank_errors(run_dir: Path, since: float) -> list[dict[str, Any]]:
    """Errors ranks reported in this launch, earliest first (the root cause is usually first)."""
    errors = []
    for path in (run_dir / "logs").glob("rank*.error.json"):
        try:
            error = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if error.get("time", 0) >= since:
            errors.append(error)
    return sorted(errors, key=lambda e: e["time"])


def describe(prepared: Prepared) -> str:
    return f"run directory {prepared.run_dir}\n$ {shlex.join(prepared.command)}"
