"""`llmtrain run`: make the run directory and train on this machine under torchrun (a one-process
run starts the trainer itself, without torchrun's agent: ``launcher.render.torchrun``).

The run directory's files are named in ``launcher.rundir``. NAME is ``run.name`` or
``<recipe>-<hash of the config>``: running the same command again finds the same folder and
resumes from its latest valid checkpoint (the hash leaves out what does not change the training
itself: the run length, checkpoint cadence, logging and launcher settings).

Lifecycle: the caller holds the run directory's lock (``launcher.launch.runlock``) from before the
first write until torchrun is gone. torchrun runs in its own session with PR_SET_PDEATHSIG
(SIGKILL) and so does every rank (``launcher.orphans``): when llmtrain dies,
even by kill -9, torchrun and the ranks die with it. Stop signals go to the ranks themselves,
never to torchrun (``stop_ranks``; a one-process run's rank is llmtrain's own child):
SIGTERM/SIGUSR1 are forwarded (the ranks checkpoint and stop; llmtrain exits 99, preempted),
Ctrl-C (SIGINT) and SIGHUP (the terminal closed) make the ranks checkpoint at the step they are
in and llmtrain exits 130 (129 for SIGHUP); a second Ctrl-C kills everything at once. The ranks
never write to the terminal: the screen shows rank 0's log as it grows
(``launcher.launch.console``), so a closed terminal or pipe never stops training.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from launcher import fsio, runfiles
from launcher.backends.common import backend_of
from launcher.config.composition.compose import Composed
from launcher.config.run_config import drop_pending, read_run_config
from launcher.config.schema import LLMTrainConfig
from launcher.config.secrets import secret_env
from launcher.errors import UserError
from launcher.launch import console, runlock
from launcher.launch.resume_decision import Decision, decide, history_line
from launcher.launch.run_outcome import (
    Launch,
    Stops,
    clean_up,
    finished,
    raise_failure,
    raise_stopped,
)
from launcher.orphans import LAUNCHER_PID_ENV, die_with_parent
from launcher.render.run_files import (
    EXECUTABLE,
    LOCAL,
    LocalLaunch,
    Place,
    local_launch,
    run_files,
)
from launcher.render.torchrun import is_single_process
from launcher.rundir import CONFIG, RunDir, fresh_name
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


def fresh_dir(run_dir: Path) -> Path:
    """The new folder `--fresh` starts in when `run_dir` exists: NAME-YYYYMMDD-HHMMSS."""
    return run_dir.with_name(fresh_name(run_dir.name))


def choose_run_dir(composed: Composed, fresh: bool) -> Path:
    """The run directory (created, resolved); --fresh picks a new timestamped one."""
    run_dir = run_dir_for(composed)
    if fresh and run_dir.exists():
        run_dir = fresh_dir(run_dir)
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
    *,
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

    What happens in a folder that may hold a run is decided first, under the lock, before any
    write (``launcher.launch.resume_decision``): a resume whose configuration changes what is
    trained is refused (exit 2) naming each difference unless `allow_config_change`, and so are
    a run file that is not a regular file and checkpoint.resume=false over a run's checkpoints.
    A resume's accepted changes are staged for rank 0 to record once its checkpoint loaded."""
    cfg = composed.config
    secrets = secret_env(cfg, os.environ)  # a missing secret stops here, before any write
    run = RunDir(choose_run_dir(composed, fresh))
    lock = runlock.acquire(run.root)
    try:
        if guard is not None:
            guard(run.root)
        decision = decide(run, composed, allow_config_change=allow_config_change, mode=mode)
        place = place_of(cfg, run.root)
        files = run_files(composed, plan_json, mode, place)  # refusals come before any write
        launch = local_launch(cfg, place) if mode == LOCAL else LocalLaunch([], {})
        _write_run_dir(run, files, decision)
        return Prepared(run.root, launch.command, launch.env, secrets=secrets, lock=lock)
    except BaseException:
        lock.release()
        raise


def _write_run_dir(run: RunDir, files: dict[str, str], decision: Decision) -> None:
    try:
        fsio.check_inside(run.logs, run.root)
        run.logs.mkdir(exist_ok=True)
        fsio.check_inside(run.torchrun_log, run.root)  # a planted link: refused before any write
        drop_pending(run)  # an earlier resume's, never accepted
        if decision.changes:  # rank 0 appends it once the checkpoint loaded (accept_resume)
            fsio.write_text_atomic(
                run.pending_history, history_line(decision.changes), root=run.root
            )
        for name, text in files.items():
            target = run.root / name
            if name == CONFIG and decision.resuming:
                # A resume: config.yaml (which export and show read) keeps describing the weights
                # on disk until the ranks have loaded them with the new configuration; rank 0
                # then renames this file over it (launcher.train.trainer). A refused resume
                # leaves it be.
                target = run.pending_config
            mode = 0o755 if name in EXECUTABLE else 0o644
            fsio.write_text_atomic(target, text, root=run.root, mode=mode)
    except fsio.UnsafePathError as exc:
        raise UserError(str(exc.strerror)) from None
    except OSError as exc:
        raise UserError(_write_problem(exc, run.root)) from None


def launch(prepared: Prepared, *, progress_to_stderr: bool = False, screen: bool = True) -> None:
    """Run torchrun (or the one rank itself) and wait. Raises RunFailed with the failing rank's
    error, RunPreempted, or RunInterrupted (``launcher.launch.run_outcome``). The run's lock stays
    open in the process started for its whole life. With `screen`, rank 0's log is shown as it
    grows (on stderr with `progress_to_stderr`: `run --json`)."""
    run = RunDir(prepared.run_dir)
    log = _open_torchrun_log(run)
    alone = is_single_process(prepared.command)  # the trainer itself, no torchrun
    started = Launch(run, time.time(), log.seek(0, os.SEEK_END), alone=alone)
    # torchrun's own messages and what the ranks print (libraries included) go to its log, never
    # to this terminal: the screen shows rank 0's log as it grows (launcher.launch.console), so
    # a closed terminal or pipe never reaches a rank. A script launched as is (Megatron-LM)
    # prints its progress itself: its torchrun.log is what is shown.
    ours = "launcher.train.loop" in prepared.command
    follow = console.Follow(
        [run.rank_log(0) if ours else run.torchrun_log],
        (sys.stderr if progress_to_stderr else sys.stdout) if screen else None,
    )
    stops = Stops()
    try:
        process = _start_torchrun(prepared, log)
        handlers = _StopHandlers(process.pid, stops, ours=ours, alone=alone)
        code = _wait(process, follow, handlers)
    finally:
        log.close()
    if finished(started, code, stops):
        return
    identity = prepared.lock.identity_env()[runfiles.LOCK_ENV] if prepared.lock else None
    clean_up(run, owner=identity is None or runfiles.lock_problem(run.lock, identity) is None)
    raise_stopped(started, stops)
    raise_failure(started, code)


def _open_torchrun_log(run: RunDir) -> IO[Any]:
    try:
        return fsio.open_append(run.torchrun_log, root=run.root, binary=True)
    except fsio.UnsafePathError as exc:
        raise UserError(str(exc.strerror)) from None
    except OSError as exc:
        raise UserError(_write_problem(exc, run.root)) from None


def _start_torchrun(prepared: Prepared, log: IO[Any]) -> subprocess.Popen[bytes]:
    """torchrun in its own session, its output into `log`, dying with this process."""
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
    return subprocess.Popen(
        prepared.command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        pass_fds=(prepared.lock.fd,) if prepared.lock is not None else (),
        # In the child between fork and exec: die with this process, or now if it already died.
        preexec_fn=(lambda: die_with_parent(me)) if sys.platform.startswith("linux") else None,
    )


class _StopHandlers:
    """What llmtrain does with a stop signal while torchrun runs: SIGTERM/SIGUSR1 are forwarded
    to the ranks; the first SIGINT/SIGHUP makes them checkpoint and stop, the second kills
    everything at once. Each is noted in `stops`, and what to tell the user in `notices`."""

    def __init__(self, torchrun: int, stops: Stops, *, ours: bool, alone: bool = False) -> None:
        # `torchrun`: the process llmtrain started; with `alone`, the only rank itself.
        self.torchrun, self.stops, self.ours, self.alone = torchrun, stops, ours, alone
        self.notices: list[str] = []

    def to_ranks(self, signum: int) -> int:
        # llmtrain's trainer tells the signals apart (interrupted or preempted); a script
        # launched as is (Megatron-LM) checkpoints on SIGTERM, as torchrun would have sent it.
        return signum if self.ours else signal.SIGTERM

    def forward(self, signum: int, frame: object) -> None:
        self.stops.forwarded.append(signum)
        self.to_each_rank(signum)

    def to_each_rank(self, signum: int) -> None:
        if self.alone:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.torchrun, self.to_ranks(signum))
        else:
            stop_ranks(self.torchrun, self.to_ranks(signum))

    def interrupt(self, signum: int, frame: object) -> None:
        if self.stops.interrupted:  # the second Ctrl-C: stop everything now
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.torchrun, signal.SIGKILL)
            for rank in worker_pids(self.torchrun):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rank, signal.SIGKILL)
            return
        self.stops.interrupted.append(signum)
        self.notices.append(
            f"stopping ({signal.Signals(signum).name}): every rank checkpoints at the step it "
            "is in; Ctrl-C again stops at once, without it"
        )
        self.to_each_rank(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        handlers = {signal.SIGTERM: self.forward, signal.SIGUSR1: self.forward}
        handlers.update({signal.SIGINT: self.interrupt, signal.SIGHUP: self.interrupt})
        previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _wait(process: subprocess.Popen[bytes], follow: console.Follow, stops: _StopHandlers) -> int:
    """torchrun's exit code, once it is gone; meanwhile the screen follows rank 0's log."""
    with stops.installed():
        while process.poll() is None:
            while stops.notices:
                follow.say(stops.notices.pop(0))
            follow.pump()
            time.sleep(0.2)
        code = process.wait()
        follow.finish()
    return code


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


def describe(prepared: Prepared) -> str:
    return f"run directory {prepared.run_dir}\n$ {shlex.join(prepared.command)}"
