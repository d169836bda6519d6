"""Every file of a run directory, named in one place (no torch import).

config.yaml       the resolved configuration the ranks train from
config.next.yaml  a resume's new configuration: the ranks train from it and rank 0 renames it to
                  config.yaml once the checkpoint loaded (a refused resume leaves config.yaml be)
config_history.jsonl  the configuration changes resumes accepted, one JSON line each; a resume's
                  line waits in config_history.next.jsonl and rank 0 appends it just before the
                  rename above (launcher.config.run_config.accept_resume): a resume that fails
                  to load records nothing
plan.json         `llmtrain plan --json` for it (predictions; the MFU denominator)
ds_config.json    the DeepSpeed config (backend=deepspeed)
megatron_args.txt Megatron-LM's pretrain_gpt.py arguments for the config (backend=megatron)
launch.sh         the exact command (torchrun, or the one trainer) and environment launched
command.json      the `llmtrain run` command that started (or last resumed) it (run_record.py)
job.sbatch        the SLURM batch script (`llmtrain submit`);  slurm.json  its job ids
logs/             rank{R}.log, rank{R}.error.json (a failed rank), torchrun.log, slurm-%j.out/err,
                  launcher.log (what a `run --detach` prints)
metrics.jsonl     one line per step;  tensorboard/  the same as TensorBoard events
checkpoints/      step_NNNNNNNN/ (launcher.train.checkpoint.store)
summary.json      written at the end of a run
preempted.json    written when a run checkpointed and stopped on a signal
.llmtrain.lock    held (flock) by the `llmtrain run` that owns the directory
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

CONFIG = "config.yaml"
PENDING_CONFIG = "config.next.yaml"
CONFIG_HISTORY = "config_history.jsonl"  # configuration changes accepted on resume
PENDING_HISTORY = "config_history.next.jsonl"  # a resume's line, until its checkpoint loads
PLAN = "plan.json"
DS_CONFIG = "ds_config.json"
LAUNCH_SCRIPT = "launch.sh"
SBATCH_SCRIPT = "job.sbatch"
HOSTFILE = "hostfile"
MEGATRON_ARGS = "megatron_args.txt"
SLURM_JOBS = "slurm.json"
LOGS = "logs"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"
SUMMARY = "summary.json"
PREEMPTED = "preempted.json"
LOCK = ".llmtrain.lock"
TORCHRUN_LOG = "torchrun.log"
LAUNCHER_LOG = "launcher.log"
COMMAND = "command.json"
# `run --fresh` beside an existing run NAME starts in NAME-YYYYMMDD-HHMMSS (its run.name is NAME).
_FRESH_SUFFIX = re.compile(r"-\d{8}-\d{6}")


def is_fresh_of(folder_name: str, name: str) -> bool:
    """Whether `folder_name` is a run `--fresh` started beside the run `name`."""
    rest = folder_name[len(name) :] if folder_name.startswith(name) else ""
    return bool(_FRESH_SUFFIX.fullmatch(rest))


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def pending_config(self) -> Path:
        return self.root / PENDING_CONFIG

    @property
    def config_history(self) -> Path:
        return self.root / CONFIG_HISTORY

    @property
    def pending_history(self) -> Path:
        return self.root / PENDING_HISTORY

    @property
    def plan(self) -> Path:
        return self.root / PLAN

    @property
    def ds_config(self) -> Path:
        return self.root / DS_CONFIG

    @property
    def megatron_args(self) -> Path:
        return self.root / MEGATRON_ARGS

    @property
    def launch_script(self) -> Path:
        return self.root / LAUNCH_SCRIPT

    @property
    def sbatch_script(self) -> Path:
        return self.root / SBATCH_SCRIPT

    @property
    def slurm_jobs(self) -> Path:
        return self.root / SLURM_JOBS

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def rank_error(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.error.json"

    def rank_errors(self) -> list[Path]:
        return sorted(self.logs.glob("rank*.error.json"))

    @property
    def torchrun_log(self) -> Path:
        return self.logs / TORCHRUN_LOG

    @property
    def launcher_log(self) -> Path:
        return self.logs / LAUNCHER_LOG

    @property
    def command(self) -> Path:
        return self.root / COMMAND

    def slurm_log(self, job: str, suffix: str) -> Path:
        return self.logs / f"slurm-{job}.{suffix}"

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def preempted(self) -> Path:
        return self.root / PREEMPTED

    @property
    def lock(self) -> Path:
        return self.root / LOCK


# The longest file name Linux file systems hold (NAME_MAX of <linux/limits.h>: 255 bytes on ext4,
# xfs, btrfs, tmpfs, NFS). The longest name llmtrain makes from run.name is `--fresh`'s
# NAME-YYYYmmdd-HHMMSS, so a run name may take what the timestamp leaves.
NAME_MAX = 255
FRESH_SUFFIX = "-%Y%m%d-%H%M%S"
MAX_RUN_NAME_BYTES = NAME_MAX - len(time.strftime(FRESH_SUFFIX, time.gmtime(0)))


def fresh_name(name: str, when: float | None = None) -> str:
    """The folder name `--fresh` gives a new run of `name` when a folder of that name exists."""
    return name + time.strftime(FRESH_SUFFIX, time.localtime(when))


CHECKPOINT_PREFIX = "step_"
# A checkpoint being written; such a folder is never read, and is removed by the next save or by
# the launcher when a run ends in failure.
UNFINISHED_PREFIX = ".tmp-"


def step_dir_name(step: int) -> str:
    """The folder of the checkpoint taken after `step` optimizer steps."""
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def unfinished_checkpoints(checkpoints: Path) -> list[Path]:
    """Checkpoint folders left half-written (a full disk, a killed rank) under `checkpoints`."""
    try:
        return sorted(checkpoints.glob(f"{UNFINISHED_PREFIX}*"))
    except OSError:
        return []
