"""Runs on this machine as first-class objects: list them, say where each stands, show its log,
stop it (`llmtrain runs`, and `status` / `logs` / `cancel` given a run directory or a run's name).

A run's state is read from its folder (launcher/rundir.py names every file), never guessed:
- running: the folder's lock (``.llmtrain.lock``) is held, as the kernel's lock table says
  (/proc/locks lists every flock with its pid and inode; reading it takes no lock, so a `run`
  starting at that moment is never disturbed). Where /proc/locks cannot be read, the lock's record
  (pid and host) and a live pid stand in.
- done: summary.json, written by rank 0 after the last step.
- failed: a rank's error report (logs/rank*.error.json), e.g. a loss that went NaN, an OOM.
- interrupted: preempted.json (a checkpoint written on Ctrl-C or a signal), or a run that stopped
  with nothing recorded (kill -9, a power cut): it resumes from its last checkpoint.
- queued: a SLURM job recorded in slurm.json is still waiting (llmtrain submit).
- unreadable: a file that says where the run stands is not a regular file (a FIFO, a device, a
  folder), a symbolic link, or too large; ``problems`` names it. Such a run is listed as such and
  never blocks the listing of the others.
Every file is read back bounded, without blocking and never through a symbolic link
(launcher/runfiles.py, launcher/bounded_read.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher import bounded_read, excerpt, runfiles
from launcher.config.differences import backend_name, distinguishing, flat_values
from launcher.errors import UserError
from launcher.launch.run_record import (
    config_values,
    layout_text,
    plan_layout,
    read_command,
    resume_command,
)
from launcher.rundir import RunDir, is_fresh_of


@dataclass(frozen=True)
class RunInfo:
    folder: Path
    status: str
    recipe: str | None
    step: int | None
    total: int | None
    loss: float | None
    started: float | None  # epoch seconds
    holder_pid: int | None  # the process holding the lock (running)
    slurm_jobs: tuple[str, ...]
    # Run files that were refused (not a regular file, a link, too large): "NAME: why".
    problems: tuple[str, ...] = ()
    # What tells runs apart (launcher.launch.run_record, launcher.views.runs): config.yaml's
    # values and the command that started the run (command.json; None before llmtrain kept one).
    values: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    command: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    layout: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # plan.json's

    @property
    def name(self) -> str:
        return self.folder.name

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "folder": str(self.folder),
            "status": self.status,
            "recipe": self.recipe,
            "step": self.step,
            "total_steps": self.total,
            "last_loss": self.loss,
            "started": self.started,
            "pid": self.holder_pid,
            "slurm_jobs": list(self.slurm_jobs),
            "problems": list(self.problems),
            "backend": backend_name(self.values),
            "layout": layout_text(self.layout, self.values),
            "overrides": self.command["typed"] if self.command else None,
            "resume_command": resume_command(self.command, self.folder) if self.command else None,
        }


def _kernel_lock_holder(lock: Path) -> int | bool | None:
    """The pid holding a flock on `lock` per /proc/locks, None when nobody does, False when the
    table cannot be read (not Linux)."""
    try:
        info = os.lstat(lock)
    except OSError:
        return None
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return False
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 2553 fe:00:2155300 0 EOF" (blocked waiters carry "->")
        if len(fields) < 6 or fields[1] != "FLOCK" or "->" in fields:
            continue
        device_inode = fields[5].rsplit(":", 1)
        if len(device_inode) == 2 and device_inode[1] == str(info.st_ino):
            major, _, minor = device_inode[0].partition(":")
            with contextlib.suppress(ValueError):
                if os.makedev(int(major, 16), int(minor, 16)) != info.st_dev:
                    continue
            with contextlib.suppress(ValueError):
                return int(fields[4])
    return None


def _record(lock: Path) -> dict[str, Any]:
    try:
        data = runfiles.read_bytes(lock, 65536)
        record = runfiles.loads(data, max_bytes=65536, max_depth=4) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _for_other_folder(run: RunDir, record: dict[str, Any]) -> bool:
    """Whether the lock's record says it was taken for another folder than `run`'s: a copy made
    with hard links shares the live run's lock file (launcher.launch.runlock)."""
    from launcher.launch.runlock import folder_id

    recorded = record.get("dir_id")
    if not isinstance(recorded, str) or record.get("host") != socket.gethostname():
        return False
    return recorded != folder_id(run.root)


def lock_holder(run: RunDir) -> int | None:
    """The pid of the process that holds the run's lock now (for this folder), or None."""
    if not run.lock.is_file() or run.lock.is_symlink():
        return None
    pid = _kernel_lock_holder(run.lock)
    if pid is not False:
        if isinstance(pid, int) and _for_other_folder(run, _record(run.lock)):
            return None
        return pid if isinstance(pid, int) else None
    record = _record(run.lock)
    if _for_other_folder(run, record):
        return None
    pid = record.get("pid")
    if record.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid


def _refused(path: Path, exc: BaseException, problems: list[str]) -> None:
    """Note a run file the reader refused (not one that is absent or half-written)."""
    # The reader's own refusals ("is a FIFO ...", "is larger than ..."), not a line being written.
    if isinstance(exc, bounded_read.FileRefused) and str(exc).startswith("is "):
        problems.append(f"{path.name} {exc}")


def _last_metrics(run: RunDir, problems: list[str]) -> dict[str, Any]:
    try:
        line = runfiles.last_line(run.metrics)
        record = runfiles.loads(line, max_bytes=65536, max_depth=4) if line else {}
    except (OSError, ValueError) as exc:
        _refused(run.metrics, exc, problems)
        return {}
    return record if isinstance(record, dict) else {}


def _number(value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return kind(value) if kind is float or float(value).is_integer() else None


def _config_facts(run: RunDir, problems: list[str]) -> tuple[str | None, int | None]:
    """(recipe, total steps) from config.yaml, else plan.json's step count."""
    import yaml

    recipe, total = None, None
    try:
        values = yaml.safe_load(runfiles.read_bytes(run.config, 1 << 20))
    except (OSError, ValueError, RecursionError, yaml.YAMLError) as exc:
        _refused(run.config, exc, problems)
        values = None
    if isinstance(values, dict):
        if isinstance(values.get("recipe"), str):
            recipe = excerpt.name(values["recipe"], 60)
        train = values.get("train")
        if isinstance(train, dict):
            total = _number(train.get("steps"), int)
    if total is None:
        try:
            plan = runfiles.read_json_object(run.plan)
            totals = plan.get("totals")
            if isinstance(totals, dict):
                total = _number(totals.get("steps"), int)
        except (OSError, ValueError) as exc:
            _refused(run.plan, exc, problems)
    return recipe, total


def _slurm_jobs(run: RunDir, problems: list[str]) -> tuple[str, ...]:
    if not os.path.lexists(run.slurm_jobs):
        return ()
    try:
        record = runfiles.read_json_object(run.slurm_jobs)
        ids = record.get("job_ids")
        if not isinstance(ids, list):
            raise runfiles.RunFileError("job_ids is not a list of job ids")
        return tuple(runfiles.job_id(i) for i in ids)
    except (OSError, ValueError) as exc:
        problems.append(f"{run.slurm_jobs.name} {exc}")
        return ()


def _started(run: RunDir) -> float | None:
    times = []
    for path in (run.config, run.plan, run.launch_script):
        with contextlib.suppress(OSError):
            times.append(os.lstat(path).st_mtime)
    return min(times) if times else None


def run_info(folder: Path) -> RunInfo:
    """Where the run in `folder` stands (see the module docstring)."""
    run = RunDir(Path(folder))
    problems: list[str] = []
    recipe, total = _config_facts(run, problems)
    last = _last_metrics(run, problems)
    step = _number(last.get("step"), int)
    loss = _number(last.get("loss"), float)
    jobs = _slurm_jobs(run, problems)
    holder = lock_holder(run)
    errors = [p for p in run.rank_errors() if not p.is_symlink()] if run.logs.is_dir() else []
    latest_error = max((_mtime(p) for p in errors), default=0.0)
    preempted = _mtime(run.preempted)
    finished = _mtime(run.summary)
    if holder is not None:
        status = "running"
    elif problems:
        status = "unreadable"
    elif finished and finished >= max(latest_error, preempted):
        status = "done"
    elif jobs and _live(run):
        status = "queued"
    elif latest_error > preempted:
        status = "failed"
    else:
        status = "interrupted"
    if status == "done" and step is None:
        step = total
    return RunInfo(
        run.root,
        status,
        recipe,
        step,
        total,
        loss,
        _started(run),
        holder,
        jobs,
        tuple(problems),
        values=config_values(run.root),
        command=read_command(run.root),
        layout=plan_layout(run.root),
    )


def _mtime(path: Path) -> float:
    """A regular file's modification time, 0 when absent (or a symbolic link)."""
    try:
        info = os.lstat(path)
    except OSError:
        return 0.0
    return info.st_mtime if stat.S_ISREG(info.st_mode) else 0.0


def _live(run: RunDir) -> bool:
    from launcher.launch.slurm import live_jobs

    try:
        return bool(live_jobs(run.root))
    except UserError:
        return False


def is_run_dir(folder: Path) -> bool:
    """A folder (not a link to one) holding a config.yaml of any kind: one that is not a regular
    file (a FIFO, a link to /dev/zero) makes the run "unreadable", never invisible."""
    return folder.is_dir() and not folder.is_symlink() and os.path.lexists(RunDir(folder).config)


def list_runs(root: Path) -> list[RunInfo]:
    """Every run directory directly under `root`, newest first."""
    if not root.is_dir():
        return []
    infos = [run_info(p) for p in sorted(root.iterdir()) if is_run_dir(p)]
    return sorted(infos, key=lambda i: -(i.started or 0.0))


def find_run(target: str, root: Path) -> Path | None:
    """A run directory given by path, by name under `root`, or by a unique prefix of a name
    (several runs named by the prefix: exit 2 listing them with what differs)."""
    return resolve_run(target, root, REFUSE).folder


# How a name that several runs begin with is resolved (see docs/training.md, "Finding a run
# again"): the newest of them (read-only commands), the newest that holds a checkpoint
# (export), the one that is running (cancel), or not at all.
NEWEST, CHECKPOINTED, RUNNING, REFUSE = "newest", "checkpointed", "running", "refuse"


@dataclass(frozen=True)
class Resolved:
    folder: Path | None
    # Set when a name matched several runs and one was chosen: says which, and the others.
    note: str | None = None


def _candidates_text(infos: list[RunInfo], shown: int = 8) -> str:
    """Each run (the first `shown`) with its state and what differs in its configuration."""
    differs = distinguishing({i.name: flat_values(i.values) for i in infos})
    text = "; ".join(
        f"{i.name} ({i.status}, started {when_text(i.started)}: {differs[i.name]})"
        for i in infos[:shown]
    )
    return text + (f"; and {len(infos) - shown} more" if len(infos) > shown else "")


def resolve_run(target: str, root: Path, choose: str = NEWEST) -> Resolved:
    """The run `target` names: a run directory's path, a run's exact name under `root` (with
    the runs `run --fresh` started beside it, NAME-YYYYMMDD-HHMMSS: runs of that name too), or
    the start of names. When several runs match, `choose` decides (NEWEST: the most recently
    started or resumed; CHECKPOINTED: the newest with a checkpoint; RUNNING: the only running
    one; REFUSE: none), and the note names the others with what differs between them; when
    nothing qualifies, exit 2 listing the candidates."""
    path = Path(target).expanduser()
    if is_run_dir(path):
        return Resolved(path.resolve())
    if "/" in target or target in (".", ".."):
        return Resolved(None)
    exact = is_run_dir(root / target)
    if not exact and not root.is_dir():
        return Resolved(None)
    try:
        entries = sorted(root.iterdir())
    except OSError:
        entries = []
    if exact:  # the run of that name and the runs `--fresh` started beside it, if any
        named = [p for p in entries if is_fresh_of(p.name, target) and is_run_dir(p)]
        matches = [root / target, *named]
    else:
        matches = [p for p in entries if p.name.startswith(target) and is_run_dir(p)]
    if len(matches) <= 1:
        return Resolved(matches[0].resolve() if matches else None)
    infos = sorted((run_info(p) for p in matches), key=lambda i: -(i.started or 0.0))
    if choose == RUNNING:
        eligible = [i for i in infos if i.status == "running"]
        if len(eligible) > 1:
            eligible = []
    elif choose == CHECKPOINTED:
        eligible = [i for i in infos if _has_checkpoint(i.folder)]
    elif choose == NEWEST:
        eligible = infos
    else:
        eligible = []
    # A name that is a run's own and its --fresh runs': the first is named by its folder.
    first = f" (the folder {root / target} for {target} itself)" if exact else ""
    if not eligible:
        why = {
            RUNNING: "none of them, or more than one, is running",
            CHECKPOINTED: "none of them holds a checkpoint",
        }.get(choose, "give more of the name")
        raise UserError(
            f"{target}: names {len(matches)} runs under {root} ({why}): "
            f"{_candidates_text(infos)}. Give the full name{first} (`llmtrain diff A B` shows "
            "how two runs differ)"
        )
    chosen = eligible[0]
    others = [i for i in infos if i.folder != chosen.folder]
    picked = {NEWEST: "the newest", CHECKPOINTED: "the newest with a checkpoint"}.get(
        choose, "the running one"
    )
    whose = f" ({target} and the runs --fresh started beside it)" if exact else ""
    note = (
        f"{target} names {len(infos)} runs{whose}; using {chosen.name}, {picked} "
        f"({_candidates_text([chosen, *others])}). Give the full name to pick another{first}"
    )
    return Resolved(chosen.folder.resolve(), note)


def _has_checkpoint(folder: Path) -> bool:
    with contextlib.suppress(OSError):
        return any(
            p.name.startswith("step_") and p.is_dir() and not p.is_symlink()
            for p in RunDir(folder).checkpoints.iterdir()
        )
    return False


def when_text(started: float | None) -> str:
    if started is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(started))


def log_files(info: RunInfo) -> list[Path]:
    run = RunDir(info.folder)
    files = [run.rank_log(0), run.torchrun_log]
    # A detached run's llmtrain writes there what it would have printed (its outcome).
    return [*files, run.launcher_log] if run.launcher_log.is_file() else files


def _signal_launcher(pid: int, record: dict[str, Any], folder: Path) -> str | None:
    """SIGINT to `pid` when it is proven to be the run's launcher (runlock.why_not_launcher), else
    why not (nothing signalled). The process is pinned by a pidfd first and proven after, so a pid
    reused between the proof and the signal is never hit."""
    from launcher.launch import runlock

    pidfd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return f"pid {pid} is gone"
    try:
        problem = runlock.why_not_launcher(pid, record, folder)
        if problem is not None:
            return problem
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGINT)
        else:
            os.kill(pid, signal.SIGINT)
    except OSError as exc:
        return f"pid {pid} cannot be signalled ({exc.strerror})"
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return None


def cancel(info: RunInfo, wait_s: float = 120.0) -> str:
    """Stop a running local run as Ctrl-C would (it checkpoints, then exits), and wait for it.
    Only a process proven to be the run's launcher is signalled; otherwise UserError at once."""
    from launcher.launch import runlock

    run = RunDir(info.folder)
    pid = _kernel_lock_holder(run.lock) if run.lock.is_file() else None
    if pid is False:
        raise UserError(
            f"run {info.name}: the kernel's lock table (/proc/locks) cannot be read here, so the "
            "process holding the run's lock cannot be proven to be its llmtrain; nothing was "
            "signalled; stop it yourself"
        )
    if pid is None:
        raise UserError(f"run {info.name} is not running ({info.status}); nothing to cancel")
    assert isinstance(pid, int)
    problem = _signal_launcher(pid, runlock.read_record(run.lock), run.root)
    if problem is not None:
        raise UserError(
            f"run {info.name}: the process holding its lock, pid {pid}, is not proven to be this "
            f"run's llmtrain ({problem}); nothing was signalled; stop it yourself if it is yours"
        )
    deadline = time.monotonic() + wait_s
    while lock_holder(run) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    if lock_holder(run) is not None:
        return f"run {info.name}: asked to stop (SIGINT to pid {pid}); still stopping"
    after = run_info(info.folder)
    return f"run {info.name}: stopped at step {after.step or 0} ({after.status})"
