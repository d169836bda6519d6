"""bench/gpu_engine_speed.py on the CPU (--smoke): real `llmtrain run`s of the MoE (grouped GEMM
experts) and DeepSpeed ZeRO-1 cases, their figures read back; exit 2 without a GPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_engine_speed.py"


def test_smoke_runs_cases_and_reports_figures(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--smoke",
            "--only",
            "tiny-moe",
            "tiny-deepspeed",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout
    doc = json.loads(report.read_text())
    assert doc["ok"] and doc["smoke"] and doc["cluster"] == "cpu"
    results = {r["name"]: r for r in doc["results"]}
    assert set(results) == {"tiny-moe", "tiny-deepspeed"}
    for r in results.values():
        assert r["problem"] is None and r["tokens_per_s"] > 0 and r["mfu"] > 0, r


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the probe needs torch")
def test_without_a_gpu_it_exits_2() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    done = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--smoke" in done.stderr
