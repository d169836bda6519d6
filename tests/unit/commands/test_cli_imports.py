"""`--help`, `show`, `validate`, `plan`, `recipes` never import torch, deepspeed or torchao
(start-up)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # each test starts processes

PROBE = """
import sys
from launcher.cli import app
try:
    app({args!r})
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed', 'torchao'))
print('HEAVY', heavy)
"""


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["show", "recipe=llama3-405b"],
        ["validate", "recipe=llama3-70b"],
        ["plan", "recipe=llama3-405b"],
        ["plan", "--search", "recipe=llama3-8b", "--top", "2"],
        ["plan", "--json-schema"],
        ["recipes"],
        ["calibrate", "--help"],
        ["plan", "--measure", "--help"],
        ["validate", "precision=fp8", "precision.fp8_emulate=true"],
        ["plan", "recipe=llama3-8b", "precision=fp8", "backend=torch"],
        ["run", "--dry-run", "cluster.gpus_per_node=2", "train.global_batch_size=16"],
        ["submit", "--dry-run", "recipe=llama3-8b", "--json"],
    ],
)
def test_no_heavy_imports(args: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True, timeout=120
    ).stdout
    assert "HEAVY []" in out, out[-2000:]
