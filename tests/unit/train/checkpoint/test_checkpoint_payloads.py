"""Tampered checkpoints never run code (issue 13): DCP .metadata pickles, DCP bytes entries and
DeepSpeed's torch.save files, with live payloads (protocols 0-5, dotted names, builtins eval/exec/
getattr). Each test first shows the payload does create its marker file when loaded without
restrictions, then that llmtrain's loader refuses it and the marker never appears."""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path

import pytest

from tests.payloads import _Reduce, pickle_payloads, torch_save_payloads

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.

torch = pytest.importorskip("torch")


def _live(load: object, data: bytes, marker: Path) -> None:
    """Control: the payload really creates the marker when loaded without restrictions."""
    assert callable(load)
    load(data)
    assert marker.exists(), "payload is not live: the test could not fail"
    marker.unlink()


@pytest.mark.integration
def test_metadata_payloads_are_refused(tmp_path: Path) -> None:
    from launcher.train.checkpoint.safe_load import UnsafeCheckpointError, load_metadata

    marker = tmp_path / "pwned"
    payloads = pickle_payloads(marker)
    assert len(payloads) >= 20
    for name, data in payloads.items():
        _live(pickle.loads, data, marker)
        with pytest.raises(UnsafeCheckpointError):
            load_metadata(data)
        assert not marker.exists(), name


def _dcp_save(state: dict[str, object], directory: Path) -> None:
    from torch.distributed.checkpoint import FileSystemWriter, save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving without one"
        save(state, storage_writer=FileSystemWriter(str(directory)))


def test_real_metadata_loads_with_the_allow_list(tmp_path: Path) -> None:
    from launcher.train.checkpoint.safe_load import SafeFileSystemReader

    _dcp_save({"w": torch.ones(3, 2), "h": torch.zeros(4, dtype=torch.bfloat16)}, tmp_path / "ck")
    metadata = SafeFileSystemReader(str(tmp_path / "ck")).read_metadata()
    assert set(metadata.state_dict_metadata) == {"w", "h"}


def test_metadata_file_payload_refused_by_the_reader(tmp_path: Path) -> None:
    from launcher.train.checkpoint.safe_load import SafeFileSystemReader, UnsafeCheckpointError

    marker = tmp_path / "pwned"
    _dcp_save({"w": torch.ones(2)}, tmp_path / "ck")
    data = pickle_payloads(marker)["dotted-dcp-metadata-p4"]
    (tmp_path / "ck" / ".metadata").write_bytes(data)
    with pytest.raises(UnsafeCheckpointError, match=r"os\.system"):
        SafeFileSystemReader(str(tmp_path / "ck")).read_metadata()
    assert not marker.exists()


@pytest.mark.integration
def test_bytes_entry_payload_is_never_torch_loaded(tmp_path: Path) -> None:
    """A legitimate .metadata whose entry for a tensor we load is a bytes entry pointing at a
    torch.save payload in the .distcp: DCP's own planner would torch.load(weights_only=False)."""
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    from launcher.train.checkpoint.safe_load import SafeFileSystemReader, TensorOnlyLoadPlanner

    marker = tmp_path / "pwned"
    ck = tmp_path / "ck"
    evil = _Reduce(os.system, (f"touch {marker}",))
    _dcp_save({"w": evil}, ck)

    def default_load(_: bytes) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load(
                {"w": torch.zeros(2)},
                storage_reader=SafeFileSystemReader(str(ck)),
                planner=DefaultLoadPlanner(),
            )

    _live(default_load, b"", marker)
    with pytest.raises(CheckpointException) as refused, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load(
            {"w": torch.zeros(2)},
            storage_reader=SafeFileSystemReader(str(ck)),
            planner=TensorOnlyLoadPlanner(),
        )
    assert "is a pickled object" in str(refused.value.failures)
    assert not marker.exists()


def test_non_tensor_state_round_trips_through_json(tmp_path: Path) -> None:
    from launcher.train.checkpoint.safe_load import (
        read_non_tensor_state,
        split_non_tensor_state,
        write_non_tensor_state,
    )

    state = {
        "model": {"w": torch.ones(1)},
        "optim": {"pg.lr": 0.1 + 2e-17, "pg.betas": (0.9, 0.95), "pg.foreach": None, "x": True},
    }
    tensors, others = split_non_tensor_state(state)
    assert set(tensors["model"]) == {"w"} and tensors["optim"] == {}
    write_non_tensor_state(tmp_path, 0, others)
    assert read_non_tensor_state(tmp_path) == others


@pytest.mark.integration
def test_deepspeed_file_payloads_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    from launcher.train.checkpoint.safe_load import (
        UnsafeCheckpointError,
        forced_weights_only,
        weights_only_load,
    )

    marker = tmp_path / "pwned"
    payloads = torch_save_payloads(marker)
    path = tmp_path / "mp_rank_00_model_states.pt"
    for name, data in payloads.items():
        path.write_bytes(data)
        _live(lambda raw: torch.load(io.BytesIO(raw), weights_only=False), data, marker)
        with pytest.raises(UnsafeCheckpointError):
            weights_only_load(path)
        # DeepSpeed's own torch.load(weights_only=False) while llmtrain loads its checkpoint:
        with forced_weights_only(), pytest.raises(pickle.UnpicklingError):
            torch.load(io.BytesIO(data), weights_only=False)
        assert not marker.exists(), name
