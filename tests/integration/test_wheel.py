"""conf/ and recipes/ travel inside the wheel: build it, install it into a fresh venv, run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def run(cmd: list[str], cwd: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=600, **kw)  # type: ignore[call-overload]


def test_wheel_carries_configs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)], ROOT
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("llmtrain-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    installed = run([str(python), "-m", "pip", "install", "-q", str(wheel)], tmp_path)
    assert installed.returncode == 0, installed.stderr[-3000:]

    # Run from an unrelated folder so nothing can be found through the checkout.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = run([str(env_dir / "bin" / "llmtrain"), "show", "recipe=gpt-7b", "--json"], elsewhere)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert json.loads(shown.stdout)["model"]["name"] == "gpt-7b"
    where = run(
        [str(python), "-c", "import launcher.resources as r; print(r.data_root())"], elsewhere
    )
    assert "site-packages" in where.stdout and "_data" in where.stdout, where.stdout
