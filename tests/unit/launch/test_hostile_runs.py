"""Issue 42, the run side: run names every command agrees on, a prompt that is not UTF-8, a run
folder whose files are not regular files, checkpoint.resume=false over a run, a resume's history
recorded only once its checkpoint loaded, and `cancel` through a hard-linked lock.

The run directories are real (train/checkpoint/test_safe_load.py's ``make_run``: a composed
config.yaml
and a signed checkpoint); `run` runs in this process with ``launch`` replaced, so a command that
gets past the resume decision exits 42 instead of starting torchrun. The safetensors headers of
item 3 are in tests/unit/export/test_safetensors_header.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher import fsio
from launcher.config.run_config import accept_resume
from launcher.rundir import MAX_RUN_NAME_BYTES, NAME_MAX, RunDir, fresh_name
from tests.cli import invoke, said
from tests.unit.train.checkpoint.test_safe_load import MODEL, make_run

# Unit tests (tests/conftest.py marks them); the one that starts a process is marked integration.

TIMEOUT_S = 20
LAUNCHED = 42


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run` past its decision exits LAUNCHED instead of starting torchrun."""

    def launch(prepared: Any, **kwargs: Any) -> None:
        raise SystemExit(LAUNCHED)

    monkeypatch.setattr("launcher.launch.local.launch", launch)


def files_of(folder: Path) -> dict[str, str]:
    """Every entry under `folder` but the lock (taken, with its record, before anything is
    decided): a regular file's bytes, else its kind (nothing opened)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.name == ".llmtrain.lock":
            continue
        if path.is_symlink():
            found[str(path.relative_to(folder))] = "link:" + os.readlink(path)
        elif path.is_fifo():
            found[str(path.relative_to(folder))] = "fifo"
        elif path.is_file():
            found[str(path.relative_to(folder))] = path.read_bytes().hex()
    return found


def run_in(root: Path, *args: str) -> tuple[int, str]:
    return said(invoke("run", *MODEL, "run.name=t", *args, cwd=root, timeout=TIMEOUT_S))


# --- run names (item 3) ---------------------------------------------------------------------------
def test_a_run_name_too_long_for_a_folder_is_refused_by_validate_dry_run_and_run(
    tmp_path: Path, no_launch: None
) -> None:
    name = "a" * 300  # the reproduction: validate and --dry-run passed, run died (ENAMETOOLONG)
    for args in (["validate"], ["run", "--dry-run"], ["run"]):
        code, output = said(invoke(*args, f"run.name={name}", cwd=tmp_path, timeout=TIMEOUT_S))
        assert code == 2, (args, output[-2000:])
        assert "run.name" in output and f"at most {MAX_RUN_NAME_BYTES}" in output, output
        assert "Traceback" not in output and name not in output
    assert not (tmp_path / "runs").exists()
    longest = "b" * MAX_RUN_NAME_BYTES  # and --fresh's timestamped name of the longest still fits
    assert said(invoke("validate", f"run.name={longest}", cwd=tmp_path))[0] == 0
    assert len(fresh_name(longest).encode()) == NAME_MAX
    (tmp_path / fresh_name(longest)).mkdir()


@pytest.mark.parametrize(
    ("value", "words"),
    [("a\udcffb", "not UTF-8"), ("a\x9bb", "C1 control"), ("é" * 120, "240 bytes")],
)
def test_run_names_that_are_not_plain_text_are_refused(
    value: str, words: str, tmp_path: Path
) -> None:
    # Through the environment: bytes that are not UTF-8 arrive as lone surrogates.
    code, output = said(
        invoke("validate", "run.name=${oc.env:NAME}", env={"NAME": value}, cwd=tmp_path)
    )
    assert code == 2 and words in output, output
    assert "Traceback" not in output and "\x9b" not in output


# --- sample (item 3) ------------------------------------------------------------------------------
def test_sample_refuses_a_prompt_that_is_not_utf8(tmp_path: Path) -> None:
    run = make_run(tmp_path, steps=(1,))
    code, output = said(invoke("sample", str(run), "caf\udce9", timeout=60))
    assert code == 2 and "not UTF-8" in output, output[-3000:]
    assert "Traceback" not in output


# --- resume on an unreadable run file (item 4) ----------------------------------------------------
def test_a_fifo_config_history_neither_hangs_nor_is_written(
    tmp_path: Path, no_launch: None
) -> None:
    run = make_run(tmp_path, steps=(1,))
    os.mkfifo(run / "config_history.jsonl")
    before = files_of(run)
    start = time.monotonic()
    code, output = run_in(tmp_path, "train.log_every=3")  # a change the history would record
    assert code == 2, output[-3000:]  # it used to block for ever, holding the run's lock
    assert time.monotonic() - start < TIMEOUT_S
    assert "config_history.jsonl is a FIFO" in " ".join(output.split()), output
    assert files_of(run) == before  # no config.next.yaml left behind, nothing written


@pytest.mark.parametrize("kind", ["fifo", "zero-link"])
def test_an_unreadable_config_yaml_is_refused_not_trained_over(
    kind: str, tmp_path: Path, no_launch: None
) -> None:
    run = make_run(tmp_path, steps=(1,))
    (run / "config.yaml").unlink()
    if kind == "fifo":
        os.mkfifo(run / "config.yaml")
    else:
        (run / "config.yaml").symlink_to("/dev/zero")
    before = files_of(run)
    code, output = run_in(tmp_path, "optim.lr=0.5", "train.steps=7")
    assert code == 2, output[-3000:]  # it used to launch: lr and steps changed, nothing recorded
    assert "config.yaml is a" in output and "nothing was started" in output, output
    assert files_of(run) == before
    # ... and such a run is listed as unreadable, not left out.
    code, output = said(invoke("runs", "--json", "--root", str(tmp_path / "runs"), timeout=10))
    assert code == 0, output
    (listed,) = json.loads(output)["runs"]
    assert listed["name"] == "t" and listed["status"] == "unreadable", listed
    assert any("config.yaml" in p for p in listed["problems"]), listed


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """TimeoutError in this block after `seconds` (SIGALRM breaks a blocked open)."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"blocked for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_append_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    with within(5), pytest.raises(fsio.UnsafePathError, match="FIFO"):
        fsio.open_append(fifo, root=tmp_path)  # it used to wait for a reader for ever
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO somebody reads: still refused
    try:
        with pytest.raises(fsio.UnsafePathError, match="not a regular file"):
            fsio.open_append(fifo, root=tmp_path)
    finally:
        os.close(reader)


# --- checkpoint.resume=false on an existing run (item 5) ------------------------------------------
def test_resume_false_over_a_run_is_refused_unless_fresh(tmp_path: Path, no_launch: None) -> None:
    run = make_run(tmp_path, steps=(1,))
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    before = files_of(run)
    for extra in ([], ["--allow-config-change"]):
        code, output = run_in(tmp_path, "checkpoint.resume=false", *extra)
        assert code == 2, output[-3000:]  # it used to train again from step 0 in place
        words = " ".join(output.split())
        assert "checkpoint.resume=false would train it again from step 0" in words, words
        assert "--fresh" in words and "Nothing was started or written" in words
        assert files_of(run) == before
    code, output = run_in(tmp_path, "checkpoint.resume=false", "--fresh")
    assert code == LAUNCHED, output[-3000:]
    assert files_of(run) == before and len(list((tmp_path / "runs").iterdir())) == 2
    # A brand-new folder starts as before.
    code, output = said(
        invoke("run", *MODEL, "run.name=new", "checkpoint.resume=false", cwd=tmp_path)
    )
    assert code == LAUNCHED, output[-3000:]


# --- a resume's history, recorded once its checkpoint loaded (item 7) -----------------------------
def test_a_resumes_history_line_waits_for_the_checkpoint_to_load(
    tmp_path: Path, no_launch: None
) -> None:
    run = RunDir(make_run(tmp_path, steps=(1,)))
    code, output = run_in(tmp_path, "train.log_every=3")
    assert code == LAUNCHED, output[-3000:]
    # Staged, not recorded: a resume that fails to load (another base, another shape) must not
    # leave an "accepted" line behind.
    assert not run.config_history.exists()
    staged = json.loads(run.pending_history.read_text())
    assert staged["event"] == "resume" and staged["trajectory_keys"] == []
    assert "train.log_every" in [c["key"] for c in staged["changes"]]
    old_config = run.config.read_text()
    # The ranks loaded the checkpoint: rank 0 records the line, then the config takes over.
    accept_resume(run)
    lines = run.config_history.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [staged]
    assert not run.pending_history.exists() and not run.pending_config.exists()
    assert run.config.read_text() != old_config
    # A history that became a FIFO meanwhile stops the resume before config.yaml changes.
    run_in(tmp_path, "train.log_every=4")
    run.config_history.unlink()
    os.mkfifo(run.config_history)
    with pytest.raises(OSError, match="FIFO"):
        accept_resume(run)
    assert run.pending_config.exists() and "log_every: 3" in run.config.read_text()


# --- cancel through a hard-linked lock (item 6) ---------------------------------------------------
HOLDER = """
import sys, time
from pathlib import Path
from launcher.launch import runlock
lock = runlock.acquire(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.integration
def test_cancel_of_a_hard_linked_copy_never_stops_the_original(tmp_path: Path) -> None:
    run = make_run(tmp_path, steps=(1,))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        snapshot = tmp_path / "runs" / "snapshot"
        subprocess.run(["cp", "-al", str(run), str(snapshot)], check=True)
        assert os.stat(snapshot / ".llmtrain.lock").st_ino == os.stat(run / ".llmtrain.lock").st_ino
        code, output = said(invoke("cancel", str(snapshot), timeout=TIMEOUT_S))
        assert code == 2, output  # it used to SIGINT the original's launcher, exit 0
        assert "nothing was signalled" in output and "hard links" in " ".join(output.split())
        time.sleep(0.5)
        assert holder.poll() is None  # the original run's launcher is untouched
        listed = said(invoke("status", str(snapshot), "--json"))[1]
        assert json.loads(listed)["status"] != "running", listed
        # The original itself is still proven and stopped.
        code, output = said(invoke("cancel", str(run), timeout=TIMEOUT_S))
        assert code == 0, output
        assert holder.wait(timeout=10) != 0
    finally:
        if holder.poll() is None:
            holder.send_signal(signal.SIGKILL)
            holder.wait()
