"""DeepSpeed imported with mlflow out of its autotuner's sight (train/deepspeed_import.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from launcher.train.deepspeed_import import import_deepspeed

pytestmark = pytest.mark.unit


def test_deepspeed_imports_without_mlflow_and_mlflow_stays_importable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stand-ins on sys.path: a "deepspeed" that imports mlflow when it can, as
    # deepspeed/autotuning/autotuner.py does, and an "mlflow" that counts its imports.
    (tmp_path / "deepspeed").mkdir()
    (tmp_path / "deepspeed" / "__init__.py").write_text(
        "try:\n    import mlflow\n    has_mlflow = True\n"
        "except ImportError:\n    has_mlflow = False\n"
    )
    (tmp_path / "mlflow.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("deepspeed", "mlflow"):  # absent now, and as they were after the test
        monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.delitem(sys.modules, name)
    deepspeed = import_deepspeed()
    assert deepspeed.__file__ == str(tmp_path / "deepspeed" / "__init__.py")
    assert deepspeed.has_mlflow is False
    assert "mlflow" not in sys.modules  # not left hidden: the tracker imports it as before
    import mlflow

    assert mlflow.__file__ == str(tmp_path / "mlflow.py")
    assert import_deepspeed() is deepspeed  # once


def test_deepspeeds_muon_kernels_are_imported_uncompiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real DeepSpeed's Muon module (imported by every ZeRO 1-2 engine) comes in without
    torch.compile wrapping its kernels, so without importing torch's inductor; torch.compile is
    itself again afterwards."""
    pytest.importorskip("deepspeed")
    import torch

    from launcher.train.deepspeed_import import MUON_MODULE, import_muon_uncompiled

    compile_ = torch.compile
    import_deepspeed()
    original = "deepspeed.runtime.zero.muon.original_muon"
    for name in (MUON_MODULE, original):  # imported afresh here, as in a new rank
        monkeypatch.delitem(sys.modules, name, raising=False)
    import_muon_uncompiled()
    kernels = sys.modules[original]
    for name in ("muon_update", "adam_update"):
        kernel = getattr(kernels, name)
        assert type(kernel).__name__ == "function", (name, type(kernel))
        assert not hasattr(kernel, "_torchdynamo_orig_callable"), name
    assert torch.compile is compile_
