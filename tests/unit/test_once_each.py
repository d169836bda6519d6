"""The things llmtrain keeps in one place: what an override names
(launcher.config.composition.overrides), the cache folder (launcher.cache_dir), the norms' default
epsilons (launcher.config.norms), the file lock (launcher.file_lock) and each rank's log
(launcher.train.reporting.rank_log)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher import file_lock
from launcher.cache_dir import cache_root
from launcher.config.composition import compose_cache
from launcher.config.composition.overrides import is_group_choice, override_key
from launcher.config.norms import LAYERNORM_EPS, RMSNORM_EPS, norm_epsilon
from launcher.errors import UserError
from launcher.plan.hardware import profile


@pytest.mark.parametrize(
    ("text", "key", "group"),
    [
        ("parallel.tp=8", "parallel.tp", False),
        ("+parallel.tp=8", "parallel.tp", False),
        ("++train.steps=3", "train.steps", False),
        ("~train.steps", "train.steps", False),
        ("model=llama3-8b", "model", True),
        ("model@x=gpt2", "model@x", True),
        ("~model", "model", False),
        (" train.steps =3", "train.steps", False),
        ("data.path=a=b", "data.path", False),
    ],
)
def test_what_an_override_names(text: str, key: str, group: bool) -> None:
    assert override_key(text) == key
    assert is_group_choice(text) is group


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("LLMTRAIN_CACHE", "XDG_CACHE_HOME", "LLMTRAIN_PROFILE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_the_cache_root_precedence(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache_root() == clean_env / "home" / ".cache" / "llmtrain"
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # empty counts as unset
    assert cache_root() == clean_env / "home" / ".cache" / "llmtrain"
    monkeypatch.setenv("XDG_CACHE_HOME", str(clean_env / "xdg"))
    assert cache_root() == clean_env / "xdg" / "llmtrain"
    monkeypatch.setenv("LLMTRAIN_CACHE", str(clean_env / "mine"))
    assert cache_root() == clean_env / "mine"


def test_every_cache_lives_under_the_one_root(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMTRAIN_CACHE", str(clean_env / "mine"))
    assert compose_cache.cache_dir() == clean_env / "mine" / "compose"
    assert profile.cache_dir() == clean_env / "mine" / "profiles"
    monkeypatch.setenv("LLMTRAIN_PROFILE_DIR", str(clean_env / "profiles"))
    assert profile.cache_dir() == clean_env / "profiles"  # moves the profiles only
    assert compose_cache.cache_dir() == clean_env / "mine" / "compose"


def test_norm_epsilon_defaults() -> None:
    assert norm_epsilon("layernorm", None) == LAYERNORM_EPS == 1e-5
    assert norm_epsilon("rmsnorm", None) == RMSNORM_EPS == 1e-6
    assert norm_epsilon("rmsnorm", 1e-5) == 1e-5
    assert norm_epsilon("layernorm", 0.0) == 0.0  # a given 0 is kept, not taken for "unset"


HOLD = (
    "import sys, time; from pathlib import Path; from launcher import file_lock; "
    "fd = file_lock.open_lock_file(Path(sys.argv[1])); assert file_lock.try_lock(fd); "
    "print('held', flush=True); time.sleep(60)"
)


@pytest.mark.integration  # starts a process (scontrol / a lock holder)
def test_a_waiting_lock_times_out_naming_the_file_then_is_free_once_the_holder_dies(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "data.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        began = time.monotonic()
        with (
            pytest.raises(TimeoutError, match=re.escape(f"for {lock}; someone is busy")),
            file_lock.waiting(lock, 0.3, busy="someone is busy"),
        ):
            pass
        assert 0.3 <= time.monotonic() - began < 5
        fd = file_lock.open_lock_file(lock)
        assert not file_lock.try_lock(fd)
        os.close(fd)
    finally:
        holder.kill()  # as kill -9: the kernel releases the flock
        holder.wait()
    with file_lock.waiting(lock, 5, busy="") as fd:
        other = file_lock.open_lock_file(lock)
        assert not file_lock.try_lock(other)  # held by this block
        os.close(other)
    other = file_lock.open_lock_file(lock)
    assert file_lock.try_lock(other)  # and released after it
    os.close(other)


def test_a_lock_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / "data.lock").symlink_to(target)
    with pytest.raises(UserError, match="is a symbolic link"):
        file_lock.open_lock_file(tmp_path / "data.lock")
    with (
        pytest.raises(UserError, match="is a symbolic link"),
        file_lock.waiting(tmp_path / "data.lock", 1, busy=""),
    ):
        pass
    assert not target.exists()


def test_a_rank_log_line_is_time_rank_message_and_goes_nowhere_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from launcher.rundir import RunDir
    from launcher.train.reporting.rank_log import rank_logger

    run = RunDir(tmp_path)
    logger = rank_logger(run, 0)
    logger.info("step 1/2 loss 5.0 (100% done, %s kept)")
    logger = rank_logger(run, 0)  # again (a second Trainer in this process): still one line each
    logger.info("ERROR: boom\nsecond line")
    lines = run.rank_log(0).read_text().splitlines()
    assert [line[8:] for line in lines[:2]] == [
        " rank0 step 1/2 loss 5.0 (100% done, %s kept)",
        " rank0 ERROR: boom",
    ]
    assert lines[2:] == ["second line"]
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d", line[:8]) for line in lines[:2])
    assert capsys.readouterr() == ("", "")  # the launcher copies rank 0's file to the screen


def test_a_rank_log_that_cannot_be_written_raises(tmp_path: Path) -> None:
    from launcher.rundir import RunDir
    from launcher.train.reporting.rank_log import rank_logger

    logger = rank_logger(RunDir(tmp_path), 0)
    (handler,) = logger.handlers
    assert isinstance(handler, __import__("logging").StreamHandler)
    with open("/dev/full", "w") as full:  # every write fails with ENOSPC, as on a full disk
        previous = handler.setStream(full)
        try:
            with pytest.raises(OSError, match="No space left"):
                logger.info("x" * 10000)
        finally:
            handler.setStream(previous)  # type: ignore[arg-type]
