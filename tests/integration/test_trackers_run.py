"""Weights & Biases (offline) and MLflow (a file: store in tmp_path) fed by a real run, read back
with their own formats and client; a resumed run continues the same tracker run."""

from __future__ import annotations

import importlib.util
import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli import llmtrain

# Installed or not, found without importing them: wandb and mlflow take ~1.5 CPU s to import,
# paid at collection by every xdist worker.
for _tracker in ("wandb", "mlflow"):
    if importlib.util.find_spec(_tracker) is None:
        pytest.skip(f"{_tracker} is not installed", allow_module_level=True)
pytestmark = pytest.mark.integration

BASE = [
    "model.seq_length=32",
    "train.micro_batch_size=4",
    "train.log_every=1",
    "checkpoint.every_steps=2",
    "run.name=tracked",
    "logging.wandb=true",
    "logging.wandb_mode=offline",
    "logging.mlflow=true",
]


def wandb_records(path: Path) -> Iterator[bytes]:
    """The records of a .wandb file: a 7-byte header (':W&B', magic 0xBEE1, version 0), then
    LevelDB log blocks of 32 KiB whose records have a 7-byte header (crc32, length, type:
    1 full, 2 first, 3 middle, 4 last)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pieces = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pieces = chunk
        elif kind == 3:
            pieces += chunk
        elif kind == 4:
            yield pieces + chunk


def wandb_history(run_file: Path) -> tuple[str, dict[int, float]]:
    from wandb.proto import wandb_internal_pb2 as pb

    run_id, losses = "", {}
    for data in wandb_records(run_file):
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            items = {i.key or ".".join(i.nested_key): i.value_json for i in record.history.item}
            if "loss" in items:  # W&B may add rows of its own (runtime, system)
                losses[int(items["_step"])] = float(items["loss"])
    return run_id, losses


def test_wandb_offline_and_mlflow_follow_a_run_across_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3: file stores by consent

    uri = f"file://{tmp_path}/mlruns"
    env = {"MLFLOW_ALLOW_FILE_STORE": "true", "WANDB_SILENT": "true"}
    first = llmtrain(
        "run", *BASE, "train.steps=4", f"logging.mlflow_tracking_uri={uri}", cwd=tmp_path, env=env
    )
    assert first.returncode == 0, first.stderr[-3000:]
    second = llmtrain(
        "run",
        *BASE,
        "train.steps=6",
        "--allow-config-change",
        f"logging.mlflow_tracking_uri={uri}",
        cwd=tmp_path,
        env=env,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout

    # W&B: two offline runs (one per job), the same id, steps 1-4 then 5-6.
    runs = sorted((tmp_path / "runs" / "tracked" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 2
    (id1, h1), (id2, h2) = wandb_history(runs[0]), wandb_history(runs[1])
    assert id1 == id2 and len(id1) == 16
    assert sorted(h1) == [1, 2, 3, 4] and sorted(h2) == [5, 6]
    lines = (tmp_path / "runs/tracked/metrics.jsonl").read_text().splitlines()
    jsonl = {json.loads(x)["step"]: json.loads(x)["loss"] for x in lines}
    assert {**h1, **h2} == pytest.approx(jsonl)

    # MLflow: one run, found again by its tag, with every step's loss, finished.
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("llmtrain")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["llmtrain.run_id"] == id1
    assert run.info.status == "FINISHED"
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
    assert history == pytest.approx(jsonl)
    assert run.data.params["model.num_layers"] == "4"
