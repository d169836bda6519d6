"""`llmtrain calibrate` measures this machine (real torch ops) and `plan --measure` trains
real shrunk runs: the profile written is valid and prices the plan; bad input exits 2 and
touches nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.plan.hardware import profile as prof
from launcher.plan.operators import operators
from tests.cli import invoke, llmtrain

pytestmark = pytest.mark.integration
# What these tests check is the profile's shape, not its precision: 10 s instead of the CPU's 60 s
# default budget (each call measured 17.6 -> 6.2 CPU s on the 2-core box, 2026-11-29).
BUDGET = ("--budget", "10")


def test_calibrate_writes_a_profile_that_plan_prices_from(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    # --force: on a busy machine (tests run beside others) figures may be noise; what this test
    # checks is the profile's shape (test_calibrate_refuses_noise_unless_forced the refusal).
    # --no-overhead: the cut runs of the per-step overhead are
    # test_calibrate_prices_two_processes_collectives_and_overhead's; here they are left out.
    done = llmtrain(
        "calibrate",
        "cluster=cpu",
        "--out",
        str(out),
        "--no-cache",
        "--force",
        "--no-overhead",
        *BUDGET,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[ 1/" in done.stderr and f"profile written: {out}" in done.stdout  # progress shown
    assert "per-step overhead" not in done.stderr
    doc = prof.read(out)  # schema, version, digest, positive finite figures
    assert not doc.get("overhead")
    assert doc["device"]["cluster_gpu"] == "cpu" and doc["device"]["kind"] == "cpu"
    assert doc["software"]["torch"] and doc["created"].endswith("Z")
    cfg = compose_config(["cluster=cpu"]).config
    ops = operators(cfg, derive_layout(cfg))
    wanted = {g.shape for g in (*ops.dense_gemms, ops.head_gemm)}
    assert {(g["m"], g["n"], g["k"]) for g in doc["gemm"]} == wanted
    assert len(doc["attention"]) == len(doc["elementwise"]) == len(doc["loss"]) == 1
    # Two sizes, the rank's own count (the tiny model fits) and a quarter of it.
    sizes = sorted(e["params"] for e in doc["optimizer"])
    assert len(sizes) == 2 and 0 < sizes[0] < sizes[1] and sizes[1] // 4 - sizes[0] <= 64
    assert not list(Path(os.environ["LLMTRAIN_PROFILE_DIR"]).glob("*.json"))  # --no-cache

    planned = invoke("plan", "cluster=cpu", f"cluster.profile={out}", "--json", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    pricing = json.loads(planned.stdout)["time"]["pricing"]
    assert pricing["source"] == "profile" and pricing["profile"]["path"] == str(out)
    assert set(pricing["parts"].values()) <= {"profile", "catalog"}

    # Calibrating another shape merges into the same file: both shapes are then in it.
    again = llmtrain(
        "calibrate",
        "cluster=cpu",
        "model.seq_length=128",
        "--out",
        str(out),
        "--no-cache",
        "--force",
        "--no-overhead",
        *BUDGET,
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr
    merged = prof.read(out)
    assert {g["m"] for g in merged["gemm"]} == {2048, 1024}
    assert len(merged["calibrated"]) == 2


def test_calibrate_refuses_bad_input_and_leaves_files_alone(tmp_path: Path) -> None:
    precious = tmp_path / "notes.json"
    precious.write_text('{"mine": 1}\n')
    done = llmtrain("calibrate", "--out", str(precious), "--no-cache", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "--out=" in done.stderr and "not a usable llmtrain profile" in done.stderr
    assert precious.read_text() == '{"mine": 1}\n'
    gpu = llmtrain(
        "calibrate",
        "cluster=h100-80gb",
        "cluster.gpus_per_node=1",
        "--no-cache",
        "--out",
        str(tmp_path / "x"),
        cwd=tmp_path,
    )
    if gpu.returncode != 0:  # a machine with a GPU measures it instead
        assert gpu.returncode == 2 and "no CUDA device on this machine" in gpu.stderr
    bad = llmtrain("calibrate", "parallel.tp=3", cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_plan_measure_trains_shrunk_runs_and_extrapolates(tmp_path: Path) -> None:
    done = invoke("plan", "--measure", "recipe=tiny", "--json", cwd=tmp_path, timeout=600)
    if done.returncode == 2 and "is not a fit any real step has" in done.stdout + done.stderr:
        # The refusal of a noisy fit (tests/unit/plan/hardware/test_measurement_noise.py): a busy
        # machine.
        pytest.skip("this machine was too busy for two short runs to differ by a layer")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    doc = json.loads(done.stdout)
    runs = doc["runs"]
    assert [r["layers"] for r in runs] == [1, 2] and doc["layers"] == 4
    for r in runs:
        assert r["measured_step_s"] > 0 and r["predicted_step_s"] > 0 and r["steps_measured"] >= 3
        assert r["measured_memory_bytes"] is not None
    # The line through the two runs, at 4 layers.
    (a, b) = (runs[0]["measured_step_s"], runs[1]["measured_step_s"])
    assert doc["measured_step_s"] == pytest.approx(a + (b - a) * 3, rel=1e-9)
    assert doc["fit"]["per_layer_s"] == pytest.approx(b - a, rel=1e-9)
    assert doc["predicted_step_s"] > 0
    assert not list(tmp_path.glob("runs"))  # the temporary run root is gone, nothing left here


def test_calibrate_refuses_noise_unless_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real measurements judged with a spread limit of 0 (any two repeats differ): every figure
    is noise, so nothing is written; --force writes it marked forced, and plan says so."""
    from launcher.errors import UserError
    from launcher.launch.calibrate import calibrate
    from launcher.plan.hardware import measurement_noise
    from launcher.plan.planner import make_plan

    monkeypatch.setattr(measurement_noise, "SPREAD_LIMIT", 0.0)
    overrides = ["cluster=cpu", "cluster.gpus_per_node=1"]  # one process: no collectives
    cfg = compose_config(overrides).config
    out = tmp_path / "cpu.json"
    lines: list[str] = []
    with pytest.raises(UserError) as info:
        calibrate(
            cfg,
            overrides,
            out=out,
            use_cache=False,
            progress=lines.append,
            budget_s=4.0,
            overhead=False,
        )
    assert "are noise or not physical, so no profile was written" in str(info.value)
    assert "--force" in str(info.value) and "core(s)" in str(info.value)
    assert any("[NOISE:" in line for line in lines) and not out.exists()

    doc, written = calibrate(
        cfg,
        overrides,
        out=out,
        use_cache=False,
        progress=lines.append,
        budget_s=4.0,
        force=True,
        overhead=False,
    )
    assert written == [out] and doc["quality"]["forced"] and doc["quality"]["problems"]
    assert prof.read(out)["quality"]["forced"]
    import dataclasses

    priced = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, profile=str(out)))
    note = make_plan(priced).profile_note
    assert note is not None and "calibrate --force" in note


def test_calibrate_prices_two_processes_collectives_and_overhead(tmp_path: Path) -> None:
    """dp=2 on the CPU: the gradient all-reduce is timed between 2 real gloo processes at its own
    size, a quarter of it and the ladder (4 KiB, 1 MiB); the per-step overhead comes from real
    2-process runs of the model cut to one layer; plan prices from both."""
    from launcher.launch.calibrate import COLLECTIVE_LADDER

    out = tmp_path / "dp2.json"
    overrides = ["recipe=tiny", "cluster.gpus_per_node=2", "train.global_batch_size=16"]
    done = llmtrain(
        "calibrate",
        *overrides,
        "--out",
        str(out),
        "--no-cache",
        "--force",
        *BUDGET,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "per-step overhead (torch dp2 tp1 pp1 cp1 ep1 zero0, cut runs)" in done.stderr
    doc = prof.read(out)
    sizes = {e["bytes"] for e in doc["collectives"] if e["kind"] == "all-reduce"}
    assert len(sizes) >= 4 and {int(b) // 4 * 4 for b in COLLECTIVE_LADDER} <= sizes
    assert all(e["ranks"] == 2 and e["backend"] == "gloo" for e in doc["collectives"])
    # Two cut runs (1 layer): the configuration's 1 micro-batch and 2; dp meets once per step.
    assert [e["layout"] for e in doc["overhead"]] == ["torch dp2 tp1 pp1 cp1 ep1 zero0"] * 2
    assert [e["units"] for e in doc["overhead"]] == [1, 1]
    for e in doc["overhead"]:
        assert e["measured_s"] > 0 and e["planned_s"] > 0
        assert e["seconds"] == pytest.approx(max(0.0, e["measured_s"] - e["planned_s"]))
    mean = sum(e["seconds"] for e in doc["overhead"]) / 2

    planned = llmtrain("plan", *overrides, f"cluster.profile={out}", "--json", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    time = json.loads(planned.stdout)["time"]
    rows = {c["name"]: c for c in time["collectives"]}
    assert rows["gradient all-reduce"]["group_size"] == 2
    if mean > 0:  # runs at one number of synchronisations: their mean
        assert rows["per-step overhead"]["time_s"] == pytest.approx(mean)
    else:
        assert "per-step overhead" not in rows
