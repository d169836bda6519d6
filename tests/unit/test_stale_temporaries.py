"""Issue 42: a `data prepare` killed outright (SIGKILL mid-write) left its `.NAME.tmp-*` folder
behind forever. The next writer beside the same output removes every temporary folder it can
prove dead (this host's, its pid gone, its flock free), never a live writer's, and no other
folder (launcher/outputs.py)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher import outputs
from tests.cli import invoke

TIMEOUT_S = 60


def _dead_pid() -> int:
    """A pid no process has now."""
    top = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    for pid in range(top, 1, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("no free pid")


def _temporary(
    parent: Path, name: str, pid: int, host: str | None = None, tail: str = "abcd1234"
) -> Path:
    folder = parent / f".{name}.tmp-{host or outputs._host_tag()}-{pid}-{tail}"
    folder.mkdir()
    (folder / "shard_00000.bin").write_bytes(b"\0" * 64)
    return folder


def _texts(tmp_path: Path) -> Path:
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.txt").write_text("some text to tokenize " * 20)
    return source


def test_the_next_prepare_removes_what_dead_writers_left_and_nothing_else(tmp_path: Path) -> None:
    source = _texts(tmp_path)
    dead = _dead_pid()
    stale = _temporary(tmp_path, "out", dead)
    other_host = _temporary(tmp_path, "out", dead, host="0badc0de")
    alive = _temporary(tmp_path, "out", os.getpid())  # a live pid: perhaps still writing
    held = _temporary(tmp_path, "out", dead, tail="held5678")
    other_name = _temporary(tmp_path, "other", dead)
    old_style = tmp_path / ".out.tmp-k3j4h5g6"  # an older llmtrain's: no owner in the name
    old_style.mkdir()
    link = tmp_path / f".out.tmp-{outputs._host_tag()}-{dead}-linked"
    link.symlink_to(other_name)
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a writer in another pid namespace holds it
        done = invoke("data", "prepare", "--input", str(source), "--output",
                      str(tmp_path / "out"), timeout=TIMEOUT_S)  # fmt: skip
    finally:
        os.close(fd)
    assert done.returncode == 0, done.stderr
    assert not stale.exists()
    for kept in (other_host, alive, held, other_name, old_style, link):
        assert os.path.lexists(kept), kept
    assert (other_name / "shard_00000.bin").exists()  # the link was not followed
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-") and
                p not in (other_host, alive, held, old_style, link)]  # fmt: skip


def test_a_failed_prepare_leaves_no_temporary_folder_and_no_open_lock(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "fine"}\n{"nope": 1}\n')
    done = invoke("data", "prepare", "--input", str(source), "--output", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    assert not outputs._HELD  # its flock's descriptor is closed


@pytest.mark.integration
def test_a_prepare_killed_with_sigkill_is_cleaned_by_the_next(tmp_path: Path) -> None:
    """A real `data prepare` (rendering slowly in its template worker) killed with SIGKILL, as
    the OOM killer kills: its worker dies with it, its temporary folder stays until the next
    prepare there removes it."""
    from tests.chat_fixtures import build_tokenizer

    tok = build_tokenizer("qwen2.5", tmp_path / "tok")
    data = tmp_path / "chat.jsonl"
    conversation = {"messages": [{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "yo"}]}  # fmt: skip
    data.write_text((json.dumps(conversation) + "\n") * 2000)
    slow = tmp_path / "slow.jinja"
    slow.write_text(
        "{% for i in range(20000) %}{% endfor %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    out = tmp_path / "out"
    args = ["data", "prepare", "--input", str(data), "--tokenizer", str(tok), "--output", str(out)]
    victim = subprocess.Popen(
        [sys.executable, "-m", "launcher", *args, "--chat-template", str(slow)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        workers = _wait_for_temporary(victim.pid, tmp_path)
    finally:
        victim.kill()
        victim.wait(timeout=30)
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
    assert len(leftovers) == 1 and not out.exists()
    data.write_text(json.dumps(conversation) + "\n")
    done = invoke(*args, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{w}").exists() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert workers and not any(Path(f"/proc/{w}").exists() for w in workers), workers


def _wait_for_temporary(parent: int, tmp_path: Path) -> list[int]:
    """Once `parent` writes its temporary folder (and a moment more): the pids of its template
    workers."""
    deadline = time.monotonic() + TIMEOUT_S
    while not any(p.name.startswith(".out.tmp-") for p in tmp_path.iterdir()):
        assert time.monotonic() < deadline, "the prepare never started writing"
        time.sleep(0.05)
    time.sleep(1.0)
    workers = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"launcher.data.templating.template_worker" in argv and str(parent).encode() in argv:
            workers.append(int(entry.name))
    return workers
