"""How a local run ended, read from its run directory and torchrun's log once torchrun is gone
(``launcher.launch.local.launch``): done, or the exception that says why not and what to do:
interrupted (Ctrl-C, SIGHUP), preempted (SIGTERM/SIGUSR1 with a checkpoint), diverged, or
failed (the rank that failed first: its error report, a signal that killed it, a full disk, an
exit code of a script launched as is)."""

from __future__ import annotations

import contextlib
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher import fsio, runfiles
from launcher.config.run_config import drop_pending
from launcher.health import DIVERGED, EXIT_DIVERGED
from launcher.rundir import RunDir, unfinished_checkpoints


class RunFailed(Exception):
    """A rank failed; the message names it and its error. Exit code 1."""

    exit_code = 1


class RunDiverged(RunFailed):
    """Training stopped on a non-finite loss or gradient norm (launcher.health); the message
    names the step, the quantity and the last good checkpoint. Exit code 3."""

    exit_code = EXIT_DIVERGED


class RunInterrupted(Exception):
    """Ctrl-C (or SIGHUP): the ranks checkpointed at the step they were in. Exit 128 + signal."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class RunPreempted(Exception):
    """The run checkpointed and stopped on SIGUSR1/SIGTERM. Exit code 99 (resume to continue)."""

    exit_code = 99


# Signals used to stop a run (torchrun's teardown, preemption, a user): a rank that exits on one of
# these was stopped, it did not fail by itself.
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1}


def _newest_checkpoint_bytes(run: RunDir) -> int:
    """Bytes of the newest complete checkpoint's files (0 without one): the room the next
    checkpoint needs."""
    newest = max(
        (p for p in run.checkpoints.glob("step_*") if p.is_dir() and not p.is_symlink()),
        default=None,
    )
    if newest is None:
        return 0
    return sum(f.stat().st_size for f in newest.rglob("*") if f.is_file() and not f.is_symlink())


def signalled_root_cause(torchrun_log: Path, offset: int) -> tuple[int, str] | None:
    """(rank, signal name) of a rank that torchrun's failure report for this launch (the log
    from `offset`) lists as killed by a signal (SIGKILL from the OOM killer or a user, SIGSEGV,
    SIGABRT...). Such a rank writes no error file, and the errors its peers write afterwards
    ("connection reset by peer") are consequences: it is the one that failed first."""
    report = _failure_report(torchrun_log, offset)
    for rank, code in re.findall(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", report, re.S):
        name = _killed_by(int(code))
        if name is not None:
            return int(rank), name
    return None


def _killed_by(code: int) -> str | None:
    """The signal an exit code (subprocess's: -N) says killed a process, unless it is one of the
    signals used to stop a run; None for an exit of its own."""
    if code >= 0:
        return None
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"signal {-code}"
    return None if sig in _STOP_SIGNALS else sig.name


def _failure_report(torchrun_log: Path, offset: int) -> str:
    """torchrun's failure report for this launch (the log from `offset`), or ''."""
    try:
        with open(torchrun_log, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    _, found, report = text.rpartition("Failures:")
    return report if found else ""


def failed_root_cause(torchrun_log: Path, offset: int) -> tuple[int, int] | None:
    """(rank, exit code) of the first failure torchrun observed ("Root Cause" in its report),
    when that rank exited with an error code of its own (a signal is ``signalled_root_cause``)."""
    report = _failure_report(torchrun_log, offset)
    _, found, cause = report.partition("Root Cause")
    if not found:
        return None
    match = re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", cause, re.S)
    if match is None or int(match.group(2)) <= 0:
        return None
    return int(match.group(1)), int(match.group(2))


def _marker_step(marker: Path) -> str:
    try:
        step = runfiles.read_json_object(marker, max_bytes=65536).get("step")
    except (OSError, ValueError):
        return "?"
    return str(step) if isinstance(step, int) and not isinstance(step, bool) else "?"


def rank_errors(run_dir: Path, since: float) -> list[dict[str, Any]]:
    """Errors ranks reported in this launch, earliest first (the root cause is usually first)."""
    errors = []
    for path in RunDir(run_dir).rank_errors():
        try:
            error = runfiles.read_json_object(path, max_bytes=8 << 20)
        except (OSError, ValueError):
            continue
        when = error.get("time")
        if isinstance(when, bool) or not isinstance(when, int | float) or when < since:
            continue
        rank = error.get("rank")
        errors.append(
            {
                "time": when,
                "rank": rank if isinstance(rank, int) and not isinstance(rank, bool) else "?",
                "type": str(error.get("type", "error"))[:200],
                "message": str(error.get("message", ""))[:4000],
            }
        )
    return sorted(errors, key=lambda e: e["time"])


@dataclass
class Stops:
    """The stop signals llmtrain received while torchrun ran (first first)."""

    interrupted: list[int] = field(default_factory=list)  # SIGINT, SIGHUP: checkpoint, stop
    forwarded: list[int] = field(default_factory=list)  # SIGTERM, SIGUSR1: handed to the ranks


@dataclass(frozen=True)
class Launch:
    """One launch in a run directory: when it started and where its log began; `alone`: the
    only rank started by itself, without torchrun (its exit code is the rank's own)."""

    run: RunDir
    started: float  # epoch seconds
    log_offset: int  # torchrun.log's size before this launch
    alone: bool = False

    @property
    def process(self) -> str:
        return "the training process" if self.alone else "torchrun"


def finished(launch: Launch, code: int, stops: Stops) -> bool:
    """Whether the run is done (a stop that came after the last step included)."""
    run = launch.run
    checkpointed = _newer(run.preempted, launch.started)
    done = _newer(run.summary, launch.started)
    return code == 0 and not checkpointed and (done or not (stops.interrupted or stops.forwarded))


def _newer(path: Path, since: float) -> bool:
    return path.is_file() and path.stat().st_mtime >= since


def clean_up(run: RunDir, *, owner: bool) -> None:
    """After a run that did not finish: a checkpoint the ranks left half-written (a full disk, a
    rank killed mid-save) is never read again, so it goes now rather than fill the disk until the
    next save; a resume's staged config.next.yaml and history line, which the ranks did not
    accept, go too. Only for the run directory's `owner`: a run whose lock file was deleted or
    replaced meanwhile may share the folder with another llmtrain, whose files are not ours to
    remove."""
    if not owner:
        return
    for unfinished in unfinished_checkpoints(run.checkpoints):
        fsio.remove_tree(unfinished)
    drop_pending(run)  # a resume the ranks did not accept


def raise_stopped(launch: Launch, stops: Stops) -> None:
    """RunInterrupted or RunPreempted when the run stopped because it was asked to."""
    run = launch.run
    marker = run.preempted
    checkpointed = _newer(marker, launch.started)
    if stops.interrupted:
        signum = stops.interrupted[0]
        name = signal.Signals(signum).name
        raise RunInterrupted(
            f"interrupted ({name}): "
            + (
                f"checkpoint at step {_marker_step(marker)} written in {run.checkpoints}; run "
                "the same command again to resume"
                if checkpointed
                else "stopped before a checkpoint could be written"
            ),
            signum,
        )
    if checkpointed:
        raise RunPreempted(
            f"preempted: checkpoint written in {run.checkpoints}; run the same "
            "command again to resume"
        )
    if stops.forwarded:  # SIGTERM/SIGUSR1 to llmtrain before the ranks could checkpoint (still
        # starting, say): a stop the user asked for, not a failure of the run
        signum = stops.forwarded[0]
        raise RunInterrupted(
            f"stopped ({signal.Signals(signum).name}) before a checkpoint could be written; run "
            "the same command again to resume from the last checkpoint there is",
            signum,
        )


def raise_failure(launch: Launch, code: int) -> None:
    """RunFailed (or RunDiverged) naming the rank that failed first and why, from what the ranks
    reported, torchrun's failure report and the disk."""
    run = launch.run
    errors = rank_errors(run.root, since=launch.started)
    if launch.alone:
        name = _killed_by(code)
        killed = None if name is None else (0, name)
    else:
        killed = signalled_root_cause(run.torchrun_log, launch.log_offset)
    if killed is not None and all(e["rank"] != killed[0] for e in errors):
        rank, signame = killed
        after = f"; then rank {errors[0]['rank']}: {errors[0]['type']}" if errors else ""
        raise RunFailed(
            f"rank {rank} failed first: killed by {signame} (out of memory, or killed by the "
            f"system or a user?){after}\n(see {run.torchrun_log}; every rank was stopped)"
        )
    if errors and errors[0]["type"] == DIVERGED:
        raise RunDiverged(
            f"{errors[0]['message']}\n(logs in {run.logs}; every rank stopped at that step)"
        )
    if errors:
        first = errors[0]
        raise RunFailed(
            f"rank {first['rank']} failed first: {first['type']}: {first['message']}\n"
            f"(traceback in {run.rank_log(first['rank'])}; every rank was stopped)"
        )
    free = fsio.free_bytes(run.root)
    if free is not None and fsio.low_on_space(run.root, _newest_checkpoint_bytes(run)):
        # No rank could say why (no room even for its error file): the same threshold the
        # ranks use for a write error without an errno (fsio.LOW_SPACE_BYTES), or less room
        # than the newest checkpoint took.
        raise RunFailed(
            f"{launch.process} exited with code {code}: the disk holding {run.root} is full "
            f"({free} bytes free, {free / 2**30:.2f} GiB); free space there and run the same "
            "command again to resume from the last good checkpoint"
        )
    if launch.alone:
        if code > 0:
            raise RunFailed(
                f"rank 0 failed: exited with code {code} without an llmtrain error report\n"
                f"(its output is in {run.torchrun_log})"
            )
        with contextlib.suppress(ValueError):  # a stop signal llmtrain did not send
            name = signal.Signals(-code).name
            raise RunFailed(
                f"rank 0 was stopped by {name}, which llmtrain did not send (another process, "
                f"or the system shutting down?), before it could checkpoint; run the same command "
                f"again to resume from the last checkpoint; see {run.torchrun_log}"
            )
    else:
        failed = failed_root_cause(run.torchrun_log, launch.log_offset)
        if failed is not None:
            rank, exit_code = failed
            raise RunFailed(
                f"rank {rank} failed first: exited with code {exit_code} without an llmtrain "
                f"error report (a script launched as is, e.g. Megatron-LM's)\n(its output is "
                f"in {run.torchrun_log}; every rank was stopped)"
            )
    raise RunFailed(
        f"{launch.process} exited with code {code} and no rank reported an error (killed by a "
        f"signal?); see {run.torchrun_log}"
    )
