"""Runs that cannot be hijacked or lost (issue 13), with real `llmtrain run` under torchrun (gloo,
2 CPU processes, tiny model): one run per directory, no orphans after kill -9 of the launcher,
Ctrl-C checkpoints and exits 130, tampered checkpoints never run code (resume falls back to the
previous verified checkpoint, and is refused when none is left) on the torch and deepspeed
backends."""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli import start
from tests.faults import children, llmtrain_run, rank_pids, steps_done
from tests.payloads import _Reduce, pickle_payloads, rewrite_manifest, torch_save_payloads

pytestmark = pytest.mark.integration

ARGS = [
    "model.seq_length=32",
    "train.micro_batch_size=4",
    "optim.warmup_steps=1",
    "cluster.gpus_per_node=2",
    "run.name=safety",
]


def _start(cwd: Path, args: list[str]) -> subprocess.Popen[str]:
    return start("run", *args, cwd=cwd)


def _wait_steps(process: subprocess.Popen[str], run_dir: Path, steps: int) -> None:
    deadline = time.monotonic() + 120
    while steps_done(run_dir) < steps:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_lock_and_no_orphans_after_kill_minus_nine(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "safety"
    first = _start(tmp_path, [*ARGS, "train.steps=100000"])
    try:
        _wait_steps(first, run_dir, 1)
        began = time.monotonic()
        second = llmtrain_run(tmp_path, [*ARGS, "train.steps=100000", "train.seed=2"], timeout=60)
        assert second.returncode == 2, second.stderr
        assert time.monotonic() - began < 10
        assert (
            f"pid {first.pid}" in second.stderr
            and "in use by another llmtrain run" in second.stderr
        )
        trainers = [*children(first.pid), *rank_pids(first.pid).values()]
        assert len(trainers) == 3  # torchrun and two ranks
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in trainers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in trainers if _alive(p)], "trainers outlived kill -9 of llmtrain"
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # The dead holder's record is explained, and the next run takes over.
    third = llmtrain_run(tmp_path, [*ARGS, "train.steps=1"], timeout=120)
    assert third.returncode == 0, third.stderr
    assert f"pid {first.pid} is no longer running" in third.stderr


def test_ctrl_c_checkpoints_at_the_interrupted_step_and_exits_130(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "safety"
    process = _start(tmp_path, [*ARGS, "train.steps=100000"])
    try:
        _wait_steps(process, run_dir, 2)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    step = steps_done(run_dir)
    assert f"checkpoint at step {step} written" in stderr
    assert (run_dir / "checkpoints" / f"step_{step:08d}" / "manifest.json").is_file()


def _bytes_entry_payload(engine_dir: Path, marker: Path) -> None:
    """Turn a tensor entry of a legitimate .metadata into a bytes entry that points at a
    torch.save payload appended to a .distcp file (DCP's planner would torch.load it)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    metadata = pickle.loads((engine_dir / ".metadata").read_bytes())  # our own, trusted file
    key = next(k for k in metadata.state_dict_metadata if k.startswith("model."))
    import torch

    buffer = io.BytesIO()
    torch.save(_Reduce(os.system, (f"touch {marker}",)), buffer)
    shard = engine_dir / "__0_0.distcp"
    offset = shard.stat().st_size
    with shard.open("ab") as f:
        f.write(buffer.getvalue())
    metadata.state_dict_metadata[key] = BytesStorageMetadata()
    metadata.storage_data = {k: v for k, v in metadata.storage_data.items() if k.fqn != key}
    metadata.storage_data[MetadataIndex(key)] = _StorageInfo(
        "__0_0.distcp", offset, len(buffer.getvalue())
    )
    (engine_dir / ".metadata").write_bytes(pickle.dumps(metadata, protocol=4))


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_tampered_checkpoints_never_run_code_and_resume_falls_back(
    tmp_path: Path, backend: str
) -> None:
    args = [*ARGS, f"backend={backend}", "checkpoint.every_steps=2", "checkpoint.keep_last=5"]
    run_dir = tmp_path / "runs" / "safety"
    done = llmtrain_run(tmp_path, [*args, "train.steps=6"], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    marker = tmp_path / "pwned"
    ckpts = run_dir / "checkpoints"
    if backend == "torch":
        payload = pickle_payloads(marker)["dotted-dcp-metadata-p4"]
        (ckpts / "step_00000006" / "engine" / ".metadata").write_bytes(payload)
        _bytes_entry_payload(ckpts / "step_00000004" / "engine", marker)
    else:
        payloads = torch_save_payloads(marker)
        for step, name in ((6, "builtins.eval-global-p2"), (4, "torch.save-reduce-p4")):
            engine = ckpts / f"step_{step:08d}" / "engine"
            target = next(engine.rglob("mp_rank_00_model_states.pt"))
            target.write_bytes(payloads[name])
    for step in (6, 4):  # the attacker also rewrites the unsigned manifests to match
        rewrite_manifest(ckpts / f"step_{step:08d}")
    longer = [*args, "train.steps=8", "--allow-config-change"]  # a longer run: accepted
    resumed = llmtrain_run(tmp_path, longer, timeout=300)
    assert not marker.exists(), "a checkpoint payload ran code"
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + (run_dir / "logs" / "rank0.log").read_text()
    assert "could not load checkpoint" in log and "step_00000006" in log
    assert f"resumed from {ckpts / 'step_00000002'} (step 2)" in resumed.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_at"] == 2

    # Every checkpoint tampered (a plain pickle in place of each one's first state file): no
    # verified checkpoint is left, so the resume is refused (exit 1) rather than retraining from
    # scratch, and no payload runs.
    for ckpt in sorted(ckpts.glob("step_*")):
        files = sorted(p for p in (ckpt / "engine").rglob("*") if p.is_file())
        victim = next(p for p in files if p.name == ".metadata" or p.suffix == ".pt")
        victim.write_bytes(pickle_payloads(marker)["os.system-reduce-p2"])
        rewrite_manifest(ckpt)
    refused = llmtrain_run(tmp_path, [*args, "train.steps=10", "--allow-config-change"])
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "refused" in refused.stderr.lower() or "not allowed" in refused.stderr.lower()
    assert not marker.exists(), "a checkpoint payload ran code"


def _mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    path.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


def test_disk_full_is_reported_and_the_last_checkpoint_survives(tmp_path: Path) -> None:
    """A real 16 MiB tmpfs as run.root_dir: the first checkpoint (~10.6 MB) fits, the second
    does not. The run exits 1 saying the disk is full, with the path and the free space."""
    root = tmp_path / "small"
    if not _mount_tmpfs(root, "16m"):
        pytest.skip("mounting a tmpfs needs root")
    try:
        args = [*ARGS, "checkpoint.every_steps=2", "train.steps=6", f"run.root_dir={root}"]
        done = llmtrain_run(tmp_path, args, timeout=300)
        assert done.returncode == 1, done.stderr[-3000:]
        # Said by the rank that hit it ("disk full writing PATH (... GiB free)"), or, when the disk
        # is too full for the rank's error file too, by the launcher ("the disk holding PATH is
        # full (0 bytes free)"): either way the path and the free space.
        said = done.stderr
        assert ("disk full writing" in said or " is full (" in said) and " free" in said, said
        assert str(root) in said, said
        from launcher.train.checkpoint.store import complete_checkpoints, verify

        ckpts = root / "safety" / "checkpoints"
        assert [s for s, _ in complete_checkpoints(ckpts)] == [2]
        assert verify(ckpts / "step_00000002") is None
        assert not list(ckpts.glob(".tmp-*"))
        # The only checkpoint damaged: the next run stops instead of silently starting over.
        (ckpts / "step_00000002" / "trainer_state.json").write_text("{}")
        again = llmtrain_run(tmp_path, args, timeout=300)
        assert again.returncode == 1 and "none verifies" in again.stderr, again.stderr[-2000:]
    finally:
        subprocess.run(["umount", str(root)], check=False)
