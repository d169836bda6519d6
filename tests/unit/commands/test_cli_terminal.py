"""On a terminal, errors wrap at its width (they were printed as one long line); piped, each stays
one whole line."""

from __future__ import annotations

import os
import pty
import re
import subprocess

import pytest

from tests.cli import llmtrain, start

pytestmark = pytest.mark.integration  # each test starts processes

LONG_ERROR = ["show", "gpt-7b"]  # an error of ~190 characters


def _on_terminal(args: list[str], columns: int) -> str:
    leader, follower = pty.openpty()
    env = {"COLUMNS": str(columns), "NO_COLOR": "1"}
    proc = start(
        *args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=follower
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(leader)
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # bold (NO_COLOR keeps styles, drops colours)


def test_errors_wrap_at_the_terminal_width() -> None:
    text = _on_terminal(LONG_ERROR, 60)
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0].startswith("error: override 'gpt-7b'"), text
    assert "recipe=gpt-7b" in " ".join(lines)
    assert max(len(line) for line in lines) <= 60, text


def test_piped_errors_stay_whole_lines() -> None:
    proc = llmtrain(*LONG_ERROR, env={"COLUMNS": "60"}, timeout=60)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: override 'gpt-7b'") and line.endswith("model=gpt-7b?")
