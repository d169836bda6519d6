"""bench/gpu_plan_vs_measured.py on the CPU (--smoke): one real `llmtrain run`, its figures
compared with the plan, the report, and every exit status (0 pass, 1 miss or failed run, 2 no GPU).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "gpu_plan_vs_measured.py"
GIB = 2**30


def bench(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=timeout
    )


def test_smoke_compares_a_real_run_with_the_plan_and_fails_outside_the_band(
    tmp_path: Path,
) -> None:
    report = tmp_path / "report.json"
    done = bench("--smoke", "--workdir", str(tmp_path / "w"), "--json", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout
    doc = json.loads(report.read_text())
    assert doc["ok"] and doc["smoke"] and doc["cluster"] == "cpu" and doc["warmup_steps"] == 1
    (run,) = doc["runs"]
    assert run["precision"] == "bf16" and run["problem"] is None
    rows = {r["figure"]: r for r in run["rows"]}
    assert list(rows) == ["step time", "tokens/s", "MFU", "peak allocated", "peak reserved"]
    run_dir = Path(run["run_dir"])
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = sorted(r["step_time_s"] for r in metrics if r["step"] > 1)
    assert rows["step time"]["measured"] == steady[len(steady) // 2]  # 3 steps: the median
    plan = json.loads((run_dir / "plan.json").read_text())
    assert rows["step time"]["predicted"] == pytest.approx(plan["time"]["step_s"], rel=1e-12)
    assert rows["MFU"]["predicted"] == pytest.approx(plan["time"]["mfu"], rel=1e-12)
    for name in ("step time", "tokens/s", "MFU"):
        r = rows[name]
        assert r["status"] == "ok" and r["measured"] > 0
        assert r["error"] == pytest.approx(r["predicted"] / r["measured"] - 1)
    for name in ("peak allocated", "peak reserved"):  # torch.cuda figures: none on the CPU
        assert rows[name]["status"] == "n/a on CPU" and rows[name]["measured"] is None
    alloc = plan["memory"]["allocated_bytes"]
    assert rows["peak allocated"]["predicted"] == pytest.approx(alloc, abs=1)

    # The same run against a band nothing meets: exit 1, the misses named.
    missed = bench(
        "--from-run", str(run_dir), "--warmup", "1", "--band", "0.0001", "--json", str(report)
    )
    assert missed.returncode == 1, missed.stdout + missed.stderr
    assert "MISS" in missed.stdout and "FAIL: outside the band" in missed.stdout
    assert "step time" in missed.stdout.split("FAIL:")[-1]
    assert not json.loads(report.read_text())["ok"]


def test_a_refused_run_fails_the_benchmark(tmp_path: Path) -> None:
    # fp8 on the CPU is refused by `llmtrain run` (exit 2): the benchmark says so and exits 1.
    done = bench("--smoke", "--fp8", "--workdir", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "`llmtrain run` refused (exit 2)" in done.stdout
    assert "precision=fp8" in done.stdout and "FAIL: run failed: fp8" in done.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="the GPU probe needs torch installed"
)
def test_without_a_gpu_it_exits_2_unless_smoke() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    done = bench("--bf16", timeout=120)
    assert done.returncode == 2
    assert "no CUDA GPU found" in done.stderr and "--smoke" in done.stderr


def test_the_cluster_follows_the_gpu_torch_names() -> None:
    spec = importlib.util.spec_from_file_location("gpu_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_bench"] = module  # dataclasses look their module up while being defined
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["gpu_bench"]
    assert module.cluster_for("NVIDIA H100 80GB HBM3", 80 * GIB) == "h100-80gb"
    assert module.cluster_for("NVIDIA H100 PCIe", 80 * GIB) == "h100-pcie"
    assert module.cluster_for("NVIDIA H100", 95 * GIB) == "h100-96gb"
    assert module.cluster_for("NVIDIA H200", 141 * GIB) == "h200"
    assert module.cluster_for("NVIDIA H100 NVL", 94 * GIB) is None
    assert module.cluster_for("NVIDIA A100-SXM4-80GB", 80 * GIB) is None


def test_rescore_reprices_the_recorded_h100_matrix_without_a_gpu() -> None:
    """The committed H100 runs (bench/results/...) against today's plan, published figures and
    profile: every entry reported, medians printed, exit 1 on a figure outside its band and 0
    when every band is wide."""
    folder = REPO / "bench" / "results" / "h100-80gb-2026-11-25"
    entries = json.loads((folder / "measured.json").read_text())["entries"]
    strict = bench("--rescore", str(folder), timeout=120)
    assert strict.returncode == 1, strict.stdout + strict.stderr
    for name, entry in entries.items():
        assert f"precision={name} (published)" in strict.stdout
        if entry["profile"] is not None:
            assert f"precision={name} (profile)" in strict.stdout
    assert "published  step time       median |error|" in strict.stdout
    assert "profile    step time       median |error|" in strict.stdout
    # A run killed before its summary has no peak reserved: reported, not invented.
    assert "not measured" in strict.stdout
    wide = bench("--rescore", str(folder), "--band", "100", timeout=120)
    assert "MISS" not in wide.stdout
