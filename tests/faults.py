"""Fault injection from outside: kill -9 a training rank of a running `llmtrain run`.

Used by tests/integration/test_kill_resume.py and bench/kill_resume.py. No hooks in the trainer:
the rank is found through /proc (llmtrain -> torchrun -> ranks, or llmtrain -> the one rank of a
one-process run) and killed with SIGKILL, as the kernel's OOM killer or a failing node would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from launcher.render.torchrun import is_single_process
from launcher.rundir import RunDir
from tests.cli import llmtrain, start

# A short 2-process run that checkpoints every 2 steps, in runs/trial of its folder.
TRIAL_STEPS = 12
KILLED_STDERR = "killed-run.stderr"
TRIAL_FIRST_CHECKPOINT = 2  # checkpoint.every_steps below
TRIAL_ARGS = [
    f"train.steps={TRIAL_STEPS}",
    "model.seq_length=64",
    "train.micro_batch_size=4",
    "optim.warmup_steps=2",
    "cluster.gpus_per_node=2",
    "checkpoint.every_steps=2",
    "run.name=trial",
]


def llmtrain_run(
    cwd: Path, args: list[str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`llmtrain run ARGS` in a child process in `cwd` (tests/cli.py)."""
    return llmtrain("run", *args, cwd=cwd, timeout=timeout)


def weights_digest(cwd: Path) -> str | None:
    """The final weights digest of the run in cwd/runs/trial (None if it did not finish)."""
    summary = RunDir(cwd / "runs" / "trial").summary
    return json.loads(summary.read_text())["weights_sha256"] if summary.is_file() else None


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The parent pid is the 2nd field after the parenthesised command name.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def rank_pids(llmtrain_pid: int) -> dict[int, int]:
    """{rank: pid} of the training processes under one `llmtrain run` process: torchrun's
    children, or llmtrain's own child for a one-process run (no torchrun)."""
    ranks = {}
    for child in children(llmtrain_pid):
        for worker in [child] if _is_trainer(child) else children(child):
            try:
                environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for item in environ:
                if item.startswith(b"RANK="):
                    ranks[int(item[5:])] = worker
    return ranks


def _is_trainer(pid: int) -> bool:
    """Whether `pid` runs llmtrain's trainer itself (not torchrun, whose command names it too),
    by the launcher's own test of a command (``is_single_process``)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return is_single_process(argv)


def steps_done(run_dir: Path) -> int:
    metrics = RunDir(run_dir).metrics
    if not metrics.is_file():
        return 0
    lines = metrics.read_text().splitlines()
    return json.loads(lines[-1])["step"] if lines else 0


def run_and_kill(
    cwd: Path, args: list[str], run_dir: Path, kill_after_step: int, rank: int, timeout: float = 300
) -> int:
    """Start `llmtrain run ARGS`, SIGKILL `rank` once `kill_after_step` steps are logged; return
    llmtrain's exit code (the run may also finish first if it is faster than the poll). Its
    stderr is left in cwd/KILLED_STDERR."""
    with open(cwd / KILLED_STDERR, "w") as stderr:
        process = start("run", *args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + timeout
    killed = False
    while process.poll() is None and time.monotonic() < deadline:
        if not killed and steps_done(run_dir) >= kill_after_step:
            pid = rank_pids(process.pid).get(rank)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed = True
        time.sleep(0.05)
    if process.poll() is None:
        process.kill()
    process.wait()
    return process.returncode
