"""The bytes checked are the bytes loaded (issue 19, reproduction 2), for both engines' checkpoint
formats and for `export` and `train.init_from`.

The run directories here are real: a config.yaml composed by llmtrain, checkpoints written by
``CheckpointWriter`` (signed with LLMTRAIN_CHECKPOINT_KEY) whose engine folders hold what the
engines write: a DCP save of the model's state dict (torch engine) or DeepSpeed's ZeRO 0-2
``engine/mp_rank_00_model_states.pt``. The attacker has write access to the run directory but
not the key: between the verifier's read and the load, a checkpoint file is replaced by the same
file of another, validly signed checkpoint (so only a re-read can notice). Before, the load read
the swapped file again and exported it under the verified step's name, exit 0."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import struct
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from launcher.config.composition.compose import compose_config
from launcher.config.schema import LLMTrainConfig
from launcher.export.hf_files import read_hf_folder
from launcher.train.checkpoint import store as checkpoint_module
from launcher.train.checkpoint.store import CheckpointWriter, verify
from launcher.train.model.transformer import build_model
from tests.cli import invoke, said

pytestmark = pytest.mark.unit
MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.ffn_hidden_size=128"]
KEY = "a-key-the-attacker-does-not-have"


def engine_writer(kind: str, state: dict[str, torch.Tensor]) -> Callable[[Path], object]:
    """What the `kind` engine writes into a checkpoint's engine/ folder (its model part)."""

    def write(directory: Path) -> None:
        if kind == "torch":
            from torch.distributed.checkpoint import FileSystemWriter
            from torch.distributed.checkpoint import save as dcp_save

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "no process group: saving without one"
                dcp_save({"model": state}, storage_writer=FileSystemWriter(str(directory)))
        else:
            (directory / "engine").mkdir()
            torch.save({"module": state}, directory / "engine" / "mp_rank_00_model_states.pt")

    return write


def make_run(
    root: Path,
    kind: str = "torch",
    steps: tuple[int, ...] = (1, 2),
    overrides: tuple[str, ...] = (),
) -> Path:
    """runs/t: config.yaml and one signed checkpoint per step, each with other weights."""
    values = compose_config([*MODEL, *overrides]).values
    run = root / "runs" / "t"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(values))
    cfg = compose_config([*MODEL, *overrides]).config
    writer = CheckpointWriter(run / "checkpoints", rank=0, keep_last=9, barrier=lambda: None)
    for step in steps:
        state = build_model(cfg.model, "cpu", seed=step).state_dict()
        writer.save(step, engine_writer(kind, state), {"step": step, "sampler": {}, "losses": []})
    return run


def data_file(run: Path, step: int, kind: str) -> Path:
    engine = run / "checkpoints" / f"step_{step:08d}" / "engine"
    return engine / ("__0_0.distcp" if kind == "torch" else "engine/mp_rank_00_model_states.pt")


def swap_after_verify(
    monkeypatch: pytest.MonkeyPatch, target: Path, replacement: Path
) -> list[Path]:
    """Replace `target` by a copy of `replacement` right after `verify` has passed it: the point
    between the verifier's read and the load, in this real process."""
    swapped: list[Path] = []
    real = checkpoint_module.verify

    def verify_then_swap(path: Path, deep: bool = True) -> str | None:
        problem = real(path, deep)
        if problem is None and target.is_relative_to(path) and not swapped:
            shutil.copyfile(replacement, path.parent / ".evil")
            os.replace(path.parent / ".evil", target)
            swapped.append(target)
        return problem

    monkeypatch.setattr(checkpoint_module, "verify", verify_then_swap)
    return swapped


@pytest.mark.parametrize("kind", ["torch", "deepspeed"])
def test_export_refuses_a_file_swapped_between_verify_and_load(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMTRAIN_CHECKPOINT_KEY", KEY)
    run = make_run(tmp_path, kind)
    target, older = data_file(run, 2, kind), data_file(run, 1, kind)
    assert target.stat().st_size == older.stat().st_size  # same shapes, other weights
    assert target.read_bytes() != older.read_bytes()
    swapped = swap_after_verify(monkeypatch, target, older)
    code, output = said(invoke("export", str(run), "--out", str(tmp_path / "hf")))
    assert swapped == [target]
    assert code == 2, output
    assert "differ from the checkpoint's manifest" in output
    assert target.name in output and "Traceback" not in output
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("kind", ["torch", "deepspeed"])
def test_init_from_refuses_a_file_swapped_between_verify_and_load(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launcher.train.checkpoint.init_from import InitFromError, expected_shapes, open_source
    from launcher.train.checkpoint.safe_load import UnsafeCheckpointError

    def whole(cfg: LLMTrainConfig) -> dict[str, torch.Tensor]:
        """Every parameter of train.init_from as the engines' build reads it: box by box (here
        one box a tensor, the whole of it)."""
        source = open_source(cfg)
        return {
            name: source.box(name, (0,) * len(shape), shape)
            for name, shape in expected_shapes(cfg.model).items()
        }

    monkeypatch.setenv("LLMTRAIN_CHECKPOINT_KEY", KEY)
    run = make_run(tmp_path, kind)
    target = data_file(run, 2, kind)
    swapped = swap_after_verify(monkeypatch, target, data_file(run, 1, kind))
    cfg = compose_config([*MODEL, f"train.init_from={run}"]).config
    manifest = "differ from the checkpoint's manifest"
    with pytest.raises((InitFromError, UnsafeCheckpointError), match=manifest):
        whole(cfg)
    assert swapped == [target]
    # Unswapped, the same reads give step 2's weights (the refusal above is the swap's doing).
    shutil.rmtree(run)
    make_run(tmp_path, kind)
    loaded = whole(cfg)
    want = build_model(cfg.model, "cpu", seed=2).state_dict()
    assert all(torch.equal(loaded[k].float(), want[k]) for k in want)


# --- an attacker outside the process: inotify, the first close after a read -------------------
_IN_CLOSE_NOWRITE = 0x10


def _inotify() -> tuple[int, Callable[[str], int]]:
    # dlopen(NULL): libc is already loaded (ctypes.util.find_library would run `ldconfig -p`).
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        pytest.skip("inotify is not available here")

    def watch(path: str) -> int:
        return int(libc.inotify_add_watch(fd, path.encode(), _IN_CLOSE_NOWRITE))

    return fd, watch


def test_export_of_a_file_swapped_at_its_first_close_loads_only_verified_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A thread that knows nothing of llmtrain swaps the newest .distcp for the older one the
    moment a reader first closes it (the verifier). Either the load refuses the swapped file, or
    the weights exported are the verified ones; never the swapped ones under step 2's name."""
    monkeypatch.setenv("LLMTRAIN_CHECKPOINT_KEY", KEY)
    run = make_run(tmp_path, "torch")
    target, older = data_file(run, 2, "torch"), data_file(run, 1, "torch")
    evil = tmp_path / "evil.distcp"
    shutil.copyfile(older, evil)
    fd, watch = _inotify()
    assert watch(str(target)) >= 0
    swapped = threading.Event()

    def swapper() -> None:
        events = os.read(fd, 4096)  # blocks until the first close-after-read
        _, mask, _, _ = struct.unpack_from("iIII", events)
        if mask & _IN_CLOSE_NOWRITE:
            os.replace(evil, target)
            swapped.set()

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    try:
        code, output = said(invoke("export", str(run), "--out", str(tmp_path / "hf")))
    finally:
        os.close(fd)
        thread.join(timeout=5)
    assert swapped.is_set(), "the swap never happened: the test could not fail"
    assert "Traceback" not in output
    if code == 0:
        cfg = compose_config(MODEL).config
        exported, _ = read_hf_folder(tmp_path / "hf")
        step2 = build_model(cfg.model, "cpu", seed=2).state_dict()
        step1 = build_model(cfg.model, "cpu", seed=1).state_dict()
        wte = exported["transformer.wte.weight"]
        assert torch.equal(wte, step2["tok_embeddings.weight"])
        assert not torch.equal(wte, step1["tok_embeddings.weight"])
    else:
        assert code == 2, output
        assert "differ from the checkpoint's manifest" in output


def test_verified_files_refuse_unlisted_and_changed_files(tmp_path: Path) -> None:
    from launcher.train.checkpoint.safe_load import CheckpointFiles, UnsafeCheckpointError

    run = make_run(tmp_path, "deepspeed", steps=(3,))
    folder = run / "checkpoints" / "step_00000003"
    files = CheckpointFiles.verified(folder)
    states = folder / "engine" / "engine" / "mp_rank_00_model_states.pt"
    assert files.read(states) == states.read_bytes()
    with pytest.raises(UnsafeCheckpointError, match="not listed"):
        files.read(folder / "engine" / "engine" / "extra.pt")
    with pytest.raises(UnsafeCheckpointError, match="outside the checkpoint"):
        files.read(tmp_path / "elsewhere.pt")
    data = bytearray(states.read_bytes())
    data[-1] ^= 1  # one bit, same size
    states.write_bytes(bytes(data))
    with pytest.raises(UnsafeCheckpointError, match="differ from the checkpoint's manifest"):
        files.read(states)
    assert verify(folder) is not None
