"""`llmtrain run`: make the run directory and train on this machine under torchrun.

The run directory's files are named in ``launcher.rundir``. NAME is ``run.name`` or
``<recipe>-<hash of the config>``: running the same command again finds the same folder and
resumes from its latest valid checkpoint (the hash leaves out what does not change the training
itself: the run length, checkpoint cadence, logging and launcher settings).

Lifecycle: the caller holds the run directory's lock (``launcher.launch.runlock``) from before the
first write until torchrun is gone. torchrun runs in its own session with PR_SET_PDEATHSIG
(SIGKILL) and so does every rank (``launcher.orphans``): when llmtrain dies,
even by kill -9, torchrun and the ranks die with it. Stop signals go to the ranks themselves,
never to torchrun (``stop_ranks``): SIGTERM/SIGUSR1 are forwarded (the ranks checkpoint and
stop; llmtrain exits 99, preempted), Ctrl-C (SIGINT) and SIGHUP (the terminal closed) make
the ranks checkpoint at the step they are in and llmtrain exits 130 (129 for SIGHUP); a second
Ctrl-C kills everything at once. The ranks never write to the terminal: the screen shows rank
0's log as it grows (``launcher.launch.console``), so a closed terminal or pipe never stops
training.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher import fsio, runfiles
from launcher.backends.common import backend_of
from launcher.config.compose import Composed
from launcher.config.run_config import (
    ALLOW_CHANGE_FLAG,
    Change,
    config_changes,
    read_run_config,
    restoring_overrides,
    resumable_config,
)
from launcher.config.schema import LLMTrainConfig
from launcher.config.secrets import secret_env
from launcher.errors import UserError
from launcher.health import DIVERGED, EXIT_DIVERGED
from launcher.launch import console, runlock
from launcher.orphans import LAUNCHER_PID_ENV, die_with_parent
from launcher.render.run_files import (
    EXECUTABLE,
    LOCAL,
    LocalLaunch,
    Place,
    local_launch,
    run_files,
)
from launcher.rundir import CONFIG, UNFINISHED_PREFIX, RunDir, unfinished_checkpoints
from launcher.validate.rules import run_name_problem

# Keys that do not change what is trained, so a changed value still resumes the same run.
_NOT_IN_NAME = (
    "run",
    "checkpoint",
    "launcher",
    "slurm",
    "train.steps",
    "train.tokens",
    "train.log_every",
    # Training health: how a diverging run is handled, not what it trains (a run stopped on a
    # non-finite step resumes with train.max_nonfinite_skips=N in the same directory).
    "train.max_nonfinite_skips",
    "train.loss_spike_window",
    "train.loss_spike_zscore",
    "backend.megatron_path",
)


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
    digest = config_digest(composed.values)
    name = cfg.run.name or f"{cfg.recipe}-{digest}"
    problem = run_name_problem(name)
    if problem is not None:
        raise UserError(problem)
    path = Path(cfg.run.root_dir).expanduser() / name
    if not cfg.run.name and not path.exists():
        return older_schema_run(path.parent, cfg.recipe, digest) or path
    return path


def older_schema_run(root: Path, recipe: str, digest: str) -> Path | None:
    """The run of this configuration made by an older llmtrain, if any: its folder name hashed
    that llmtrain's keys (one added or removed since changes the hash), but its config.yaml, read
    as this llmtrain reads it (launcher.config.run_config: defaults for keys added since, keys
    removed since set aside), hashes to `digest`."""
    pattern = re.compile(re.escape(recipe) + r"-[0-9a-f]{8}")
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return None
    for entry in entries:
        config = RunDir(entry).config
        if not pattern.fullmatch(entry.name) or not config.is_file():
            continue
        try:
            values = read_run_config(config).values
        except UserError:
            continue
        if config_digest(values) == digest:
            return entry
    return None


def has_checkpoints(run: RunDir) -> bool:
    """Whether the run directory holds checkpoints (llmtrain's or Megatron-LM's) to resume."""
    try:
        return any(not p.name.startswith(UNFINISHED_PREFIX) for p in run.checkpoints.iterdir())
    except OSError:
        return False


@dataclass(frozen=True)
class Prepared:
    run_dir: Path
    command: list[str]
    # Written into launch.sh; the secrets are only ever handed to the torchrun process.
    env: dict[str, str]
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    # Held from before the first write until the run is over; None only in tests.
    lock: runlock.RunLock | None = field(default=None, repr=False, compare=False)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


def choose_run_dir(composed: Composed, fresh: bool) -> Path:
    """The run directory (created, resolved); --fresh picks a new timestamped one."""
    run_dir = run_dir_for(composed)
    if fresh and run_dir.exists():
        run_dir = run_dir.with_name(f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(_write_problem(exc, run_dir)) from None
    return run_dir.resolve()


def _write_problem(exc: OSError, path: Path) -> str:
    return fsio.describe_write_error(exc, path) or (
        f"cannot write the run directory {path}: {exc.strerror or exc}; set run.root_dir to a "
        "writable folder"
    )


def place_of(cfg: LLMTrainConfig, run_dir: Path) -> Place:
    """Where a run in `run_dir` lives on this machine (this Python, working directory, CPU count,
    the backend's checkout): what the run directory's renderer needs besides the config."""
    from launcher.launch.preflight import megatron_root

    checkout = megatron_root(cfg) if backend_of(cfg).entry else None
    return Place(str(run_dir), sys.executable, os.getcwd(), os.cpu_count() or 1, checkout)


def prepare_run_dir(
    composed: Composed,
    plan_json: dict[str, Any],
    fresh: bool,
    guard: Callable[[Path], None] | None = None,
    mode: str = LOCAL,
    allow_config_change: bool = False,
) -> Prepared:
    """Take the run directory's lock (``launcher.launch.runlock``; exit 2 naming the holder when
    another run has it), call `guard` with the run directory under the lock (`run` passes
    ``slurm.refuse_live_jobs``), then write its files for `mode` (``launcher.render.run_files``:
    the same bytes `--dry-run` prints). The caller releases ``Prepared.lock`` when the run is
    over (``launch`` keeps it held in torchrun meanwhile).

    A resume whose configuration differs from the run's recorded one in a key that changes the
    training (``launcher.config.run_config.changes_trajectory``) is refused (exit 2, nothing
    written) naming each difference and the command that resumes the run as it was, unless
    `allow_config_change`; accepted differences are appended to config_history.jsonl."""
    cfg = composed.config
    secrets = secret_env(cfg, os.environ)  # a missing secret stops here, before any write
    run = RunDir(choose_run_dir(composed, fresh))
    lock = runlock.acquire(run.root)
    try:
        if guard is not None:
            guard(run.root)
        changes: list[Change] = []
        resuming = cfg.checkpoint.resume and run.config.is_file() and has_checkpoints(run)
        if resuming:
            # Resuming a run an older llmtrain started: exit 2 naming the keys this one does
            # not know (launcher.config.run_config), before anything is written or started.
            stored = resumable_config(run.config)
            changes = config_changes(stored.values, composed.values)
            if any(c.trajectory for c in changes) and not allow_config_change:
                raise UserError(_resume_refusal(run, stored.values, composed, changes, mode))
        place = place_of(cfg, run.root)
        files = run_files(composed, plan_json, mode, place)  # refusals come before any write
        launch = local_launch(cfg, place) if mode == LOCAL else LocalLaunch([], {})
        _write_run_dir(run, files, resuming)
        if changes:
            _record_changes(run, changes)
        return Prepared(run.root, launch.command, launch.env, secrets=secrets, lock=lock)
    except BaseException:
        lock.release()
        raise


def _command_word(mode: str) -> str:
    return "llmtrain run" if mode == LOCAL else "llmtrain submit"


def _resume_refusal(
    run: RunDir, recorded: dict[str, Any], composed: Composed, changes: list[Change], mode: str
) -> str:
    """Why this resume is refused, and what to type instead: the command with the run's own
    values back (checked by composing it), the flag that accepts the change, a new run."""
    from launcher.config.compose import compose_config

    given = {o.split("=", 1)[0].lstrip("+~") for o in composed.overrides}
    lines = []
    for change in changes:
        if change.trajectory:
            named = change.key in given or change.key.split(".")[0] in given  # key or its group
            why = "" if named else " (not set on this command: the recipe's value)"
            lines.append(f"  {change.line()}{why}")
    word = _command_word(mode)
    restored = restoring_overrides(composed.overrides, changes)
    try:  # the suggestion must compose to the run's trajectory, or it is not offered
        again = compose_config(restored)
        exact = not any(c.trajectory for c in config_changes(recorded, again.values))
    except UserError:
        exact = False
    # The commands repeat the user's overrides: a secret given there is never printed (its
    # variable instead where the environment holds it, else ***).
    overrides = list(composed.overrides)
    for name, value in secret_env(composed.config, os.environ).items():
        if len(value) >= 4:
            shown = f"${{oc.env:{name}}}" if os.environ.get(name) == value else "***"
            restored = [o.replace(value, shown) for o in restored]
            overrides = [o.replace(value, shown) for o in overrides]
    resume = (
        f"  to resume it as it was started:  {shlex.join([*word.split(), *restored])}\n"
        if exact
        else "  to resume it as it was started: set each key above back to its old value\n"
    )
    given_args = shlex.join([*word.split(), *overrides, ALLOW_CHANGE_FLAG])
    fresh = (
        f"  to start a new run instead:  {shlex.join([*word.split(), *overrides])} --fresh"
        if mode == LOCAL
        else "  to start a new run instead: give it another run.name"
    )
    text = (
        f"{run.root} holds a run (checkpoints in {run.checkpoints}) whose configuration "
        f"({run.config}) differs from this command's in what it trains:\n"
        + "\n".join(lines)
        + "\nNothing was started or written.\n"
        + resume
        + f"  to continue it with the new values:  {given_args}  (recorded in "
        f"{run.config_history})\n" + fresh
    )
    return text


def _record_changes(run: RunDir, changes: list[Change]) -> None:
    """Append this resume's configuration changes to the run's config_history.jsonl."""
    trajectory = [c.key for c in changes if c.trajectory]
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "event": "resume",
        "accepted": ALLOW_CHANGE_FLAG if trajectory else "no change to what is trained",
        "trajectory_keys": trajectory,
        "changes": [
            {"key": c.key, "old": c.old, "new": c.new, "trajectory": c.trajectory} for c in changes
        ],
    }
    try:
        with fsio.open_append(run.config_history, root=run.root) as f:
            f.write(json.dumps(entry, sort_keys=False, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except fsio.UnsafePathError as exc:
        raise UserError(str(exc.strerror)) from None
    except OSError as exc:
        raise UserError(_write_problem(exc, run.root)) from None


def _write_run_dir(run: RunDir, files: dict[str, str], resuming: bool) -> None:
    try:
        fsio.check_inside(run.logs, run.root)
        run.logs.mkdir(exist_ok=True)
        fsio.check_inside(run.torchrun_log, run.root)  # a planted link: refused before any write
        for name, text in files.items():
            target = run.root / name
            if name == CONFIG and resuming:
                # A resume: config.yaml (which export and show read) keeps describing the weights
                # on disk until the ranks have loaded them with the new configuration; rank 0
                # then renames this file over it (launcher.train.trainer). A refused resume
                # leaves it be.
                target = run.pending_config
            mode = 0o755 if name in EXECUTABLE else 0o644
            fsio.write_text_atomic(target, text, root=run.root, mode=mode)
        if not resuming and os.path.lexists(run.pending_config):
            os.unlink(run.pending_config)
    except fsio.UnsafePathError as exc:
        raise UserError(str(exc.strerror)) from None
    except OSError as exc:
        raise UserError(_write_problem(exc, run.root)) from None


def launch(prepared: Prepared, progress_to_stderr: bool = False, screen: bool = True) -> None:
    """Run torchrun and wait. Raises RunFailed with the failing rank's error, RunPreempted, or
    RunInterrupted. The run's lock stays open in torchrun for its whole life. With `screen`,
    rank 0's log is shown as it grows (on stderr with `progress_to_stderr`: `run --json`)."""
    keep_fds = (prepared.lock.fd,) if prepared.lock is not None else ()
    run = RunDir(prepared.run_dir)
    me = os.getpid()
    # The ranks check that torchrun is still this process's child (launcher.orphans).
    env = {**os.environ, **prepared.env, **prepared.secrets, LAUNCHER_PID_ENV: str(me)}
    inherited = os.environ.get("PYTHONPATH")
    if inherited and "PYTHONPATH" in prepared.env:
        # The backend's checkout first, then this environment's own path (e.g. megatron-core
        # installed with pip --target), which the checkout alone would hide.
        env["PYTHONPATH"] = os.pathsep.join([prepared.env["PYTHONPATH"], inherited])
    if prepared.lock is not None:  # every rank checks the lock is still ours before a checkpoint
        env.update(prepared.lock.identity_env())
    try:
        log = fsio.open_append(run.torchrun_log, root=run.root, binary=True)
    except fsio.UnsafePathError as exc:
        raise UserError(str(exc.strerror)) from None
    except OSError as exc:
        raise UserError(_write_problem(exc, run.root)) from None
    log_offset = log.seek(0, os.SEEK_END)
    started = time.time()
    # torchrun's own messages and what the ranks print (libraries included) go to its log, never
    # to this terminal: the screen shows rank 0's log as it grows (launcher.launch.console), so
    # a closed terminal or pipe never reaches a rank. A script launched as is (Megatron-LM)
    # prints its progress itself: its torchrun.log is what is shown.
    ours = "launcher.train.loop" in prepared.command
    follow = console.Follow(
        [run.rank_log(0) if ours else run.torchrun_log],
        (sys.stderr if progress_to_stderr else sys.stdout) if screen else None,
    )
    process = subprocess.Popen(
        prepared.command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        pass_fds=keep_fds,
        # In the child between fork and exec: die with this process, or now if it already died.
        preexec_fn=(lambda: die_with_parent(me)) if sys.platform.startswith("linux") else None,
    )
    interrupted: list[int] = []
    forwarded: list[int] = []
    notices: list[str] = []

    def to_ranks(signum: int) -> int:
        # llmtrain's trainer tells the signals apart (interrupted or preempted); a script
        # launched as is (Megatron-LM) checkpoints on SIGTERM, as torchrun would have sent it.
        return signum if ours else signal.SIGTERM

    def forward(signum: int, frame: object) -> None:
        forwarded.append(signum)
        stop_ranks(process.pid, to_ranks(signum))

    def interrupt(signum: int, frame: object) -> None:
        if interrupted:  # the second Ctrl-C: stop everything now
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            for rank in worker_pids(process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rank, signal.SIGKILL)
            return
        interrupted.append(signum)
        notices.append(
            f"stopping ({signal.Signals(signum).name}): every rank checkpoints at the step it "
            "is in; Ctrl-C again stops at once, without it"
        )
        stop_ranks(process.pid, to_ranks(signum))

    handlers = {signal.SIGTERM: forward, signal.SIGUSR1: forward}
    handlers.update({signal.SIGINT: interrupt, signal.SIGHUP: interrupt})
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        while process.poll() is None:
            while notices:
                follow.say(notices.pop(0))
            follow.pump()
            time.sleep(0.2)
        code = process.wait()
        follow.finish()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.close()
    marker = run.preempted
    checkpointed = marker.is_file() and marker.stat().st_mtime >= started
    summary = run.summary
    finished = summary.is_file() and summary.stat().st_mtime >= started
    if code == 0 and not checkpointed and (finished or not (interrupted or forwarded)):
        return  # done (a stop that came after the last step included)
    # Cleaning up is for the run directory's owner only: a run whose lock file was deleted or
    # replaced meanwhile may share the folder with another llmtrain, whose half-written
    # checkpoint and staged config.next.yaml are not ours to remove.
    identity = prepared.lock.identity_env()[runfiles.LOCK_ENV] if prepared.lock else None
    owner = identity is None or runfiles.lock_problem(run.lock, identity) is None
    # Every rank has stopped; a checkpoint they left half-written (a full disk, a rank killed
    # mid-save) is never read again, so it goes now rather than fill the disk until the next save.
    for unfinished in unfinished_checkpoints(run.checkpoints) if owner else []:
        fsio.remove_tree(unfinished)
    if owner and os.path.lexists(run.pending_config):  # a resume the ranks did not accept
        os.unlink(run.pending_config)
    if interrupted:
        signum = interrupted[0]
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
    if forwarded:  # SIGTERM/SIGUSR1 to llmtrain before the ranks could checkpoint (still
        # starting, say): a stop the user asked for, not a failure of the run
        signum = forwarded[0]
        raise RunInterrupted(
            f"stopped ({signal.Signals(signum).name}) before a checkpoint could be written; run "
            "the same command again to resume from the last checkpoint there is",
            signum,
        )
    errors = rank_errors(run.root, since=started)
    killed = signalled_root_cause(run.torchrun_log, log_offset)
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
            f"torchrun exited with code {code}: the disk holding {run.root} is full "
            f"({free} bytes free, {free / 2**30:.2f} GiB); free space there and run the same "
            "command again to resume from the last good checkpoint"
        )
    failed = failed_root_cause(run.torchrun_log, log_offset)
    if failed is not None:
        rank, exit_code = failed
        raise RunFailed(
            f"rank {rank} failed first: exited with code {exit_code} without an llmtrain error "
            f"report (a script launched as is, e.g. Megatron-LM's)\n(its output is in "
            f"{run.torchrun_log}; every rank was stopped)"
        )
    raise RunFailed(
        f"torchrun exited with code {code} and no rank reported an error (killed by a signal?); "
        f"see {run.torchrun_log}"
    )


def worker_pids(torchrun: int) -> list[int]:
    """The processes torchrun started (the ranks: each in a session of its own), from
    /proc/PID/task/*/children (Linux); [] where that cannot be read."""
    pids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{torchrun}/task")
    except OSError:
        return pids
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):
            text = Path(f"/proc/{torchrun}/task/{task}/children").read_text()
            pids += [int(pid) for pid in text.split()]
    return sorted(set(pids))


def stop_ranks(torchrun: int, signum: int) -> None:
    """Hand a stop signal to the ranks themselves: each checkpoints at the step it is in and
    exits 0 (``launcher.train.trainer.stop_exit_code``), so torchrun ends without a failure to
    report (a signal to torchrun makes it print a SignalException traceback). Before the ranks
    exist, torchrun gets SIGTERM and stops them as it does."""
    ranks = worker_pids(torchrun)
    for rank in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank, signum)
    if not ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(torchrun, signal.SIGTERM)


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
        if int(code) >= 0:
            continue
        try:
            sig = signal.Signals(-int(code))
        except ValueError:
            return int(rank), f"signal {-int(code)}"
        if sig not in _STOP_SIGNALS:
            return int(rank), sig.name
    return None


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


def describe(prepared: Prepared) -> str:
    return f"run directory {prepared.run_dir}\n$ {shlex.join(prepared.command)}"
