"""Runs that diverge, fill the disk, are resumed with another shape, or lose their launcher
(issue 19), with real `llmtrain run` under torchrun (gloo, CPU processes, the tiny model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from launcher.train.checkpoint.store import complete_checkpoints, verify
from tests.faults import llmtrain_run

pytestmark = pytest.mark.integration

# The reproduction, verbatim: NaN from the fifth step.
DIVERGING = [
    "optim.lr=30",
    "optim.warmup_steps=15",
    "optim.grad_clip=0",
    "train.steps=30",
    "checkpoint.every_steps=3",
    "checkpoint.keep_last=2",
]
SMALL = ["model.seq_length=32", "train.micro_batch_size=4", "cluster.gpus_per_node=2"]


def _strict(value: str) -> Any:
    raise AssertionError(f"metrics.jsonl holds {value}: not JSON")


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line, parse_constant=_strict) for line in lines]


def _steps(run_dir: Path) -> list[int]:
    return sorted(step for step, _ in complete_checkpoints(run_dir / "checkpoints"))


def test_diverging_run_stops_at_the_first_nonfinite_step_and_resumes(tmp_path: Path) -> None:
    """Was: loss NaN from step 6, checkpoints 27 and 30 of NaN weights, the good ones pruned for
    them, exit 0. Now: exit 3 at the first non-finite step, naming it, the quantity and the last
    good checkpoint, which stays (keep_last=2 prunes nothing for it) and resumes."""
    args = [*DIVERGING, "run.name=nan"]
    done = llmtrain_run(tmp_path, args, timeout=300)
    assert done.returncode == 3, done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "nan"
    said = done.stderr
    assert "training diverged at step " in said and "is not finite" in said, said
    assert str(run_dir / "checkpoints" / "step_00000003") in said, said
    assert _steps(run_dir) == [3]
    assert verify(run_dir / "checkpoints" / "step_00000003") is None
    assert not (run_dir / "summary.json").exists()
    records = _metrics(run_dir)
    last = records[-1]
    assert last["nonfinite"] and last["step"] < 6, last
    assert all("grad_norm" in r for r in records)
    assert all(r["grad_norm"] is not None for r in records[:-1])
    stop = last["step"]

    # The same command resumes from the last good checkpoint and stops at the same step.
    again = llmtrain_run(tmp_path, args, timeout=300)
    assert again.returncode == 3, again.stderr[-3000:]
    assert "resumed from" in again.stdout and "step_00000003 (step 3)" in again.stdout
    assert f"training diverged at step {stop}:" in again.stderr
    assert _steps(run_dir) == [3]

    # Allowed to skip, it finishes from there (same run directory): every non-finite step is
    # counted and its update withheld, so the checkpoints it writes hold finite weights.
    # same run directory; skipping and a shorter schedule change the trajectory: accepted by flag
    skips = [*args, "train.max_nonfinite_skips=100", "train.steps=12", "--allow-config-change"]
    skipping = llmtrain_run(tmp_path, skips, timeout=300)
    assert skipping.returncode == 0, skipping.stderr[-3000:]
    assert "update skipped" in skipping.stdout
    records = _metrics(run_dir)
    skipped = [r for r in records if r.get("skipped")]
    assert skipped and records[-1]["nonfinite_skips"] == len(
        [r for r in records if r.get("skipped") and r["step"] > 3 and "nonfinite_skips" in r]
    )
    assert _steps(run_dir) == [9, 12]
    assert verify(run_dir / "checkpoints" / "step_00000012") is None


def test_pipeline_ranks_stop_together_on_a_nonfinite_step(tmp_path: Path) -> None:
    """backend=torch with pp=2: the loss lives on the last stage only; both stages skip the
    same steps and stop at the same one (max_nonfinite_skips=2 exceeded on the third)."""
    args = [
        *DIVERGING,
        *SMALL,
        "parallel.pp=2",
        "model.tie_embeddings=false",
        "train.max_nonfinite_skips=2",
        "run.name=pp",
    ]
    done = llmtrain_run(tmp_path, args, timeout=300)
    assert done.returncode == 3, done.stderr[-3000:]
    assert "train.max_nonfinite_skips=2 exceeded" in done.stderr
    logs = tmp_path / "runs" / "pp" / "logs"
    errors = [json.loads((logs / f"rank{r}.error.json").read_text()) for r in (0, 1)]
    assert {e["type"] for e in errors} == {"TrainingDiverged"}
    assert errors[0]["message"].split(":")[0] == errors[1]["message"].split(":")[0]
    records = _metrics(tmp_path / "runs" / "pp")
    assert [r["step"] for r in records if r.get("skipped")][-3:] == [
        records[-1]["step"] - 2,
        records[-1]["step"] - 1,
        records[-1]["step"],
    ]


def test_deepspeed_diverging_run_skips_then_stops(tmp_path: Path) -> None:
    """backend=deepspeed, ZeRO stage 0 in fp32, the one case where DeepSpeed applies whatever
    update it gets (llmtrain's guard withholds it). Was exit 0 with NaN checkpoints, and a
    gradient norm of NaN in metrics.jsonl on every step."""
    args = [
        *DIVERGING,
        *SMALL,
        "backend=deepspeed",
        "precision=fp32",
        "train.max_nonfinite_skips=1",
        "run.name=ds",
    ]
    done = llmtrain_run(tmp_path, args, timeout=400)
    assert done.returncode == 3, done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "ds"
    records = _metrics(run_dir)
    assert all(r["grad_norm"] is not None for r in records if not r.get("nonfinite"))
    stop = records[-1]["step"]
    assert [r["step"] for r in records if r.get("skipped")] == [stop - 1, stop]
    good = [s for s in _steps(run_dir)]
    assert good and max(good) < stop
    assert verify(run_dir / "checkpoints" / f"step_{max(good):08d}") is None
    assert f"step_{max(good):08d} (step {max(good)})" in done.stderr


def _mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    path.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


def test_refused_resume_leaves_config_yaml_as_it_was(tmp_path: Path) -> None:
    """Resuming with another model width is refused (exit 2 by the launcher; with
    --allow-config-change, exit 1 by the ranks, checkpoints kept); config.yaml used to describe
    the refused width already, and `export` then wrote a config.json of the wrong width beside
    the weights."""
    base = ["train.steps=2", "checkpoint.every_steps=2", "optim.warmup_steps=1", "run.name=w"]
    first = llmtrain_run(tmp_path, base, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "runs" / "w"
    before = (run_dir / "config.yaml").read_bytes()
    width = [*base, "train.steps=4", "model.hidden_size=192", "model.num_attention_heads=4"]
    assert llmtrain_run(tmp_path, width, timeout=300).returncode == 2
    wider = llmtrain_run(tmp_path, [*width, "--allow-config-change"], timeout=300)
    assert wider.returncode == 1, wider.stderr[-3000:]
    assert (run_dir / "config.yaml").read_bytes() == before
    assert not (run_dir / "config.next.yaml").exists()
    assert _steps(run_dir) == [2]
    # An accepted resume (a longer run) does replace it.
    longer = llmtrain_run(tmp_path, [*base, "train.steps=4", "--allow-config-change"], timeout=300)
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "steps: 4" in (run_dir / "config.yaml").read_text()
    assert not (run_dir / "config.next.yaml").exists()
    # Only the resume that loaded is in the history (the refused width used to be recorded too).
    history = (run_dir / "config_history.jsonl").read_text().splitlines()
    assert [json.loads(line)["trajectory_keys"] for line in history] == [["train.steps"]]


# The parent of `llmtrain run`: a child subreaper (as tmux, systemd services and containers' init
# are), so orphans come to it instead of pid 1. It kills llmtrain with SIGKILL as soon as a rank
# process exists (the rank is then importing torch), then reports which of its descendants are
# still alive after `wait` seconds, reaps them, and kills any survivor.
SUBREAPER = textwrap.dedent(
    """
    import ctypes, json, os, signal, subprocess, sys, time
    from tests.cli import start
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    llmtrain = start("run", *sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def alive_descendants():
        parent_of, state = {}, {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    text = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
                    cmd = open(f"/proc/{entry}/cmdline", "rb").read()
                except OSError:
                    continue
                parent_of[int(entry)] = (int(text[1]), cmd)
                state[int(entry)] = text[0]
        found = []
        for pid in parent_of:
            if pid == os.getpid():
                continue
            p = pid
            while p in parent_of and p != os.getpid():
                p = parent_of[p][0]
            if p == os.getpid() and state[pid] != "Z":
                found.append((pid, parent_of[pid][1].decode(errors="replace")))
        return found
    deadline = time.monotonic() + 120
    def is_rank(cmd):  # torchrun's own command line names the module too
        return "launcher.train.loop" in cmd and "torch.distributed.run" not in cmd
    while not any(is_rank(c) for _, c in alive_descendants()):
        assert time.monotonic() < deadline and llmtrain.poll() is None
        time.sleep(0.005)
    os.kill(llmtrain.pid, signal.SIGKILL)
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end and alive_descendants():
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.1)
    survivors = alive_descendants()
    for pid, _ in survivors:
        os.kill(pid, signal.SIGKILL)
    print(json.dumps([cmd for _, cmd in survivors]))
    """
)


def test_ranks_die_with_llmtrain_under_a_subreaper(tmp_path: Path) -> None:
    """kill -9 of `llmtrain run` while its rank is still importing torch, under a subreaper:
    the rank used to arm its parent-death guard only after the import and to take only
    "parent is pid 1" for death, so it ran on forever (5 of 11 trials in the issue)."""
    script = tmp_path / "subreaper.py"
    script.write_text(SUBREAPER)
    args = ["train.steps=50", "run.name=orphan", "optim.warmup_steps=1"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, str(script), "10", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [], done.stdout
