"""Issue 42, the run side: run names every command agrees on, a prompt that is not UTF-8.

The run directories are real (tests/unit/test_safe_load.py's ``make_run``: a composed config.yaml
and a signed checkpoint); `run` runs in this process with ``launch`` replaced, so a command that
gets past the resume decision exits 42 instead of starting torchrun. The safetensors headers of
item 3 are in tests/unit/test_safetensors_header.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from launcher.rundir import MAX_RUN_NAME_BYTES, NAME_MAX, fresh_name
from tests.cli import invoke, said
from tests.unit.test_safe_load import MODEL, make_run

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
