"""`llmtrain run` as a user meets it on a real terminal (a pseudo-terminal whose controlling
process is llmtrain, as a shell's foreground job is), through a pipe, and detached: real torchrun,
one CPU process, the tiny model.

- the screen and rank 0's log show one line per log interval (step, loss, lr, grad norm, tok/s,
  memory); Ctrl-C prints the stop on a line of its own, checkpoints and exits 130, and no log
  holds a traceback;
- a closed terminal (the pty's hang-up: SIGHUP to llmtrain) checkpoints and stops as Ctrl-C does
  (exit 129, status interrupted, the command that resumes it);
- a pipe whose reader went away (`llmtrain run | head -3`) never stops training;
- `run --detach` survives the hang-up of the terminal that started it, `logs --follow` shows its
  loss lines, and `cancel` stops it cleanly.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import select
import signal
import subprocess
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli import command, invoke, llmtrain
from tests.faults import steps_done

pytestmark = pytest.mark.integration

ARGS = ["model.seq_length=32", "train.micro_batch_size=4", "train.log_every=2"]
# In 80 columns (launcher.train.reporting.metrics.LINE_WIDTH): step, loss, grad norm, tokens/s, eta
# first.
INTERVAL = re.compile(r"^step (\d+)/(\d+) \| loss \d+\.\d{4} \| grad norm \S+ \| [\d,]+ tok/s ")
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _controlling_terminal() -> None:
    """In the child: make fd 0 (the pty) this new session's controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """A command on a pseudo-terminal of its own: it leads a session whose controlling terminal
    is the pty, so typed ^C and a hang-up reach it as they reach a shell's foreground job."""

    def __init__(self, argv: list[str], cwd: Path):
        self.leader, follower = os.openpty()
        env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=follower,
            stdout=follower,
            stderr=follower,
            start_new_session=True,
            preexec_fn=_controlling_terminal,
        )
        os.close(follower)
        self.raw = b""

    @property
    def text(self) -> str:
        return ESCAPES.sub("", self.raw.decode("utf-8", "replace")).replace("\r\n", "\n")

    def read_until(self, done: Callable[[str], bool], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.text):
            assert time.monotonic() < deadline, f"timed out; the screen shows:\n{self.text}"
            assert self.process.poll() is None or self._pending(), f"exited:\n{self.text}"
            self._read(0.2)

    def _pending(self) -> bool:
        return bool(select.select([self.leader], [], [], 0)[0])

    def _read(self, wait: float) -> bool:
        if not select.select([self.leader], [], [], wait)[0]:
            return True
        try:
            data = os.read(self.leader, 65536)
        except OSError:  # EIO: every holder of the terminal's other side is gone
            return False
        self.raw += data
        return bool(data)

    def type(self, keys: bytes) -> None:
        os.write(self.leader, keys)

    def hang_up(self) -> None:
        """Close the terminal (what closing its window does): SIGHUP to its session."""
        os.close(self.leader)
        self.leader = -1

    def finish(self, timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        while self.leader >= 0 and time.monotonic() < deadline and self._read(0.2):
            if self.process.poll() is not None and not self._pending():
                break
        try:
            return self.process.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            self.close()

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.leader >= 0:
            os.close(self.leader)
            self.leader = -1


def _intervals(text: str) -> list[str]:
    return [line for line in text.splitlines() if INTERVAL.match(line)]


def _unprefixed(log: str) -> str:
    """A rank log's lines without their ``HH:MM:SS rank0`` prefix."""
    return re.sub(r"^\S+ rank0 ", "", log, flags=re.M)


def _no_traceback(run_dir: Path, *texts: str) -> None:
    for log in sorted((run_dir / "logs").glob("*.log")):
        assert "Traceback" not in log.read_text(), f"{log.name}:\n{log.read_text()[-3000:]}"
    for text in texts:
        assert "Traceback" not in text, text[-3000:]


def test_ctrl_c_on_a_terminal_shows_every_interval_then_a_clean_stop(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "screen"
    screen = Terminal(command("run", *ARGS, "train.steps=100000", "run.name=screen"), tmp_path)
    try:
        screen.read_until(lambda text: len(_intervals(text)) >= 2)
        screen.type(b"\x03")  # Ctrl-C
        code = screen.finish()
    finally:
        screen.close()
    text = screen.text
    assert code == 130, text
    shown = _intervals(text)
    assert [int(INTERVAL.match(line)[1]) for line in shown[:2]] == [2, 4], text  # type: ignore[index]
    rank0 = (run_dir / "logs" / "rank0.log").read_text()
    for line in shown:  # what the screen showed is in the log, line for line
        assert f" rank0 {line}\n" in rank0, (line, rank0)
    lines = text.splitlines()
    assert any(line.startswith("stopping (SIGINT): every rank checkpoints") for line in lines), text
    step = steps_done(run_dir)
    assert f"interrupted (SIGINT): checkpoint at step {step} written" in text
    assert any(line.startswith("interrupted (SIGINT)") for line in lines), text
    assert (run_dir / "checkpoints" / f"step_{step:08d}" / "manifest.json").is_file()
    _no_traceback(run_dir, text)
    # `logs` (what --follow prints while it runs) has the loss history.
    logs = invoke("logs", "screen", cwd=tmp_path, timeout=60)
    assert (
        logs.returncode == 0
        and len(_intervals(re.sub(r"^\S+ rank0 ", "", logs.stdout, flags=re.M))) >= 2
    )


def test_a_closed_terminal_checkpoints_and_stops_like_ctrl_c(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "hangup"
    args = [*ARGS, "train.steps=100000", "run.name=hangup"]
    screen = Terminal(command("run", *args), tmp_path)
    try:
        screen.read_until(lambda text: len(_intervals(text)) >= 2)
        screen.hang_up()
        code = screen.process.wait(timeout=120)
    finally:
        screen.close()
    assert code == 129  # 128 + SIGHUP, as a shell reports a job the hang-up stopped
    marker = json.loads((run_dir / "preempted.json").read_text())
    step = steps_done(run_dir)
    assert (marker["signal"], marker["step"]) == ("SIGHUP", step)
    assert (run_dir / "checkpoints" / f"step_{step:08d}" / "manifest.json").is_file()
    _no_traceback(run_dir)
    status = invoke("status", "hangup", cwd=tmp_path, env={"COLUMNS": "300"}, timeout=60)
    assert status.returncode == 0 and "hangup (tiny): interrupted" in status.stdout, status
    assert "llmtrain run " + " ".join(args) in status.stdout, status.stdout


def test_a_closed_pipe_never_stops_training(tmp_path: Path) -> None:
    # `llmtrain run ... | head -3`: the reader leaves after three lines; the run goes on to its
    # last step and finishes as it would have.
    run_dir = tmp_path / "runs" / "piped"
    process = subprocess.Popen(
        command("run", *ARGS, "train.steps=8", "train.log_every=1", "run.name=piped"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        head = [process.stdout.readline() for _ in range(3)]
        process.stdout.close()  # head exits
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr.decode()[-3000:]
    assert steps_done(run_dir) == 8 and (run_dir / "summary.json").is_file()
    assert b"step 1/8 | loss" in head[1], head
    assert (run_dir / "checkpoints" / "step_00000008" / "manifest.json").is_file()
    _no_traceback(run_dir, stderr.decode())


def test_detach_survives_the_terminal_and_cancel_stops_it(tmp_path: Path) -> None:
    # A shell on a terminal starts the run detached, then the terminal closes (logout): the
    # shell's session gets SIGHUP, the run does not.
    run_dir = tmp_path / "runs" / "away"
    detach = " ".join(command("run", "--detach", *ARGS, "train.steps=100000", "run.name=away"))
    shell = Terminal(["/bin/sh", "-c", f"{detach}; echo detach-exit=$?; exec sleep 300"], tmp_path)
    try:
        shell.read_until(lambda text: "detach-exit=" in text, timeout=120)
        text = shell.text
        assert "detach-exit=0" in text, text
        assert "started away in the background" in text
        assert "follow it: llmtrain logs away --follow" in text
        shell.hang_up()
        assert shell.process.wait(timeout=30) == -signal.SIGHUP  # the terminal's job died
    finally:
        shell.close()
    before = steps_done(run_dir)
    deadline = time.monotonic() + 120
    while steps_done(run_dir) < max(before + 1, 4):  # still training after the hang-up
        assert time.monotonic() < deadline, "the detached run stopped with its terminal"
        time.sleep(0.2)
    listed = json.loads(invoke("runs", "--json", cwd=tmp_path, timeout=60).stdout)["runs"]
    assert [(r["name"], r["status"]) for r in listed] == [("away", "running")]
    cancelled = llmtrain("cancel", "away", cwd=tmp_path, timeout=180)
    assert cancelled.returncode == 0 and "(interrupted)" in cancelled.stdout, cancelled
    step = steps_done(run_dir)
    assert (run_dir / "checkpoints" / f"step_{step:08d}" / "manifest.json").is_file()
    followed = invoke("logs", "away", "--follow", cwd=tmp_path, timeout=60)  # returns: stopped
    assert followed.returncode == 0
    assert len(_intervals(_unprefixed(followed.stdout))) >= 2
    assert f"interrupted (SIGINT): checkpoint at step {step} written" in followed.stdout
    _no_traceback(run_dir, followed.stdout)
    with contextlib.suppress(FileNotFoundError):
        assert "Traceback" not in (run_dir / "logs" / "launcher.log").read_text()
