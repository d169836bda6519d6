"""Resume loads the bytes it verified (issue 19, reproduction 2), with a real `llmtrain run`.

After a signed run (LLMTRAIN_CHECKPOINT_KEY), an attacker without the key watches the newest
checkpoint's data file with inotify and, the moment the trainer's verifier first closes it after
reading, replaces it by the same file of an older checkpoint (validly signed, same size, other
weights). Before, the trainer read the file again to load it and resumed from the newest step with
the older step's weights, silently. Now each file is read once, checked, and loaded from that
buffer: the swapped file is refused and the run falls back to the previous checkpoint."""

from __future__ import annotations

import os
import shutil
import struct
import threading
from pathlib import Path

import pytest

from tests.faults import llmtrain_run
from tests.unit.train.checkpoint.test_safe_load import _IN_CLOSE_NOWRITE, _inotify

pytestmark = pytest.mark.integration

ARGS = [
    "model.seq_length=32",
    "train.micro_batch_size=4",
    "optim.warmup_steps=1",
    "cluster.gpus_per_node=1",
    "run.name=verified",
    "checkpoint.every_steps=2",
    "checkpoint.keep_last=5",
]


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_a_file_swapped_after_the_verifier_read_it_is_refused_on_resume(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMTRAIN_CHECKPOINT_KEY", "the-run-key")
    args = [*ARGS, f"backend={backend}"]
    done = llmtrain_run(tmp_path, [*args, "train.steps=6"], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ckpts = tmp_path / "runs" / "verified" / "checkpoints"
    name = "__0_0.distcp" if backend == "torch" else "mp_rank_00_model_states.pt"
    target = next((ckpts / "step_00000006").rglob(name))
    older = next((ckpts / "step_00000002").rglob(name))
    assert target.stat().st_size == older.stat().st_size
    evil = tmp_path / "evil"
    shutil.copyfile(older, evil)
    fd, watch = _inotify()
    assert watch(str(target)) >= 0
    swapped = threading.Event()

    def swapper() -> None:
        events = os.read(fd, 4096)  # the first close after a read: the verifier's
        if struct.unpack_from("iIII", events)[1] & _IN_CLOSE_NOWRITE:
            os.replace(evil, target)
            swapped.set()

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    try:
        resumed = llmtrain_run(
            tmp_path, [*args, "train.steps=8", "--allow-config-change"], timeout=300
        )
    finally:
        os.close(fd)
        thread.join(timeout=5)
    assert swapped.is_set(), "the swap never happened: the test could not fail"
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + (ckpts.parent / "logs" / "rank0.log").read_text()
    assert "could not load checkpoint" in log and "differ from the checkpoint's manifest" in log
    assert f"resumed from {ckpts / 'step_00000004'} (step 4)" in resumed.stdout
