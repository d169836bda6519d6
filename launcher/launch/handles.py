"""A run as one handle, on this machine or on SLURM: where it stands, its logs, stopping it, and
the command that resumes it. `llmtrain status | logs | cancel` resolve what the user typed (a
run's name, a run directory, a SLURM job id) to a handle with ``open_run`` and call it; what
differs between a local run and a SLURM job lives in the two implementations, not in the
commands."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from launcher import runfiles
from launcher.errors import UserError
from launcher.launch import local_runs, run_logs, slurm
from launcher.launch.run_record import metric_history, resume_command
from launcher.launch.run_status import status_lines
from launcher.rundir import RunDir

Write = Callable[[str], None]


class RunHandle(Protocol):
    """What `status`, `logs` and `cancel` ask of a run."""

    @property
    def units(self) -> str:
        """The key `cancel --json` lists what it stopped under: "runs" or "jobs"."""
        ...

    def status_document(self) -> dict[str, Any]:
        """Where it stands, for `status --json`."""
        ...

    def status_lines(self) -> list[str]:
        """Where it stands, in words, for `status`."""
        ...

    def logs(self, write: Write, *, follow: bool) -> None:
        """Print its logs; with `follow`, until it stops."""
        ...

    def log_texts(self) -> list[tuple[Path, bytes | None]]:
        """(path, its text or None when absent) of each log, for `logs --json`."""
        ...

    def cancel(self) -> list[str]:
        """Stop it and wait until it stopped: one line per unit stopped."""
        ...

    def resume_command(self, cwd: str | None = None) -> str | None:
        """The command that resumes it (``cd DIR &&`` first when it was started elsewhere than
        `cwd`); None when it recorded none."""
        ...


@dataclass(frozen=True)
class LocalRun:
    """A run started on this machine with `llmtrain run` (launcher.launch.local_runs)."""

    info: local_runs.RunInfo
    units: str = "runs"

    def status_document(self) -> dict[str, Any]:
        history = metric_history(self.info.folder)
        losses = [[int(r["step"]), r.get("loss")] for r in history]
        return {**self.info.to_json(), "losses": losses}

    def status_lines(self) -> list[str]:
        history = metric_history(self.info.folder)
        resume = resume_command(self.info.command, self.info.folder, os.getcwd())
        return status_lines(self.info, history, resume)

    def logs(self, write: Write, *, follow: bool) -> None:
        """Rank 0's log and torchrun's (their last LOG_TAIL_BYTES); with `follow`, until the run
        stops running."""
        run = RunDir(self.info.folder)
        run_logs.follow_logs(
            lambda: local_runs.log_files(self.info),
            self.info.folder,
            write,
            follow=follow,
            going=lambda: local_runs.lock_holder(run) is not None,
            tail=True,
        )

    def log_texts(self) -> list[tuple[Path, bytes | None]]:
        files = local_runs.log_files(self.info)
        return run_logs.log_texts(files, self.info.folder, tail=True)

    def cancel(self) -> list[str]:
        return [local_runs.cancel(self.info)]

    def resume_command(self, cwd: str | None = None) -> str:
        """Its recorded command (launch.run_record.resume_command), or the advice to run the
        same command when it recorded none."""
        return resume_command(self.info.command, self.info.folder, cwd)


@dataclass(frozen=True)
class SlurmJob:
    """Jobs submitted with `llmtrain submit` (launcher.launch.slurm): a run directory's, or one
    job given by its id."""

    target: slurm.Target
    units: str = "jobs"

    def status_document(self) -> dict[str, Any]:
        return slurm.status_document(self.target)

    def status_lines(self) -> list[str]:
        return slurm.status_lines(self.target)

    def logs(self, write: Write, *, follow: bool) -> None:
        """The jobs' stdout and stderr, and rank 0's log; with `follow`, until every job
        finished."""
        ids = self.target.job_ids
        run_logs.follow_logs(
            lambda: slurm.log_files(self.target),
            self.target.run_dir,
            write,
            follow=follow,
            going=lambda: not all(slurm.job_state(j) in slurm.FINISHED | {None} for j in ids),
            tail=False,
        )

    def log_texts(self) -> list[tuple[Path, bytes | None]]:
        files = slurm.log_files(self.target)
        return run_logs.log_texts(files, self.target.run_dir, tail=False)

    def cancel(self) -> list[str]:
        return slurm.cancel(self.target)

    def resume_command(self, cwd: str | None = None) -> None:
        """A submitted run records no command: `llmtrain submit` with the overrides that
        submitted it resumes it, which only its submitter knows."""
        return None


def open_run(
    target: str, root: Path, *, choose: str = local_runs.NEWEST, note: Write | None = None
) -> RunHandle:
    """The run `target` names: a run directory, a run's name under `root` (a name that several
    runs begin with resolves as `choose` says, and `note` is told which and the others), or a
    SLURM job id. A run directory with SLURM jobs recorded is a SlurmJob; else a LocalRun."""
    resolved = local_runs.resolve_run(target, root, choose)
    if resolved.folder is not None:
        if resolved.note and note is not None:
            note(resolved.note)
        info = local_runs.run_info(resolved.folder)
        if not info.slurm_jobs:
            return LocalRun(info)
        return SlurmJob(slurm.resolve(str(resolved.folder)))
    if not runfiles.is_job_id(target) and not Path(target).expanduser().is_dir():
        raise UserError(
            f"{target}: no run of that name under {root}/ (`llmtrain runs` lists them), and "
            "neither a run directory nor a SLURM job id"
        )
    return SlurmJob(slurm.resolve(target))
