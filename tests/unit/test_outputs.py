"""Destructive options only destroy what llmtrain made (issue 19, reproductions 4, 5 and 9, and
the tracebacks of 11): `data prepare --overwrite` and `export --overwrite` replace only a folder
the same command wrote (its marker lists every file; a user's file beside them is never deleted),
never a run directory, its parent or a folder holding one; outputs are renamed into place without
replacing what appeared meanwhile; export refuses weights whose shapes config.json would
misdescribe; refused checkpoints are exit 2 with messages that quote nothing of the file."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml

from launcher import outputs
from launcher.data import prepare as prepare_module
from launcher.data.prepare import prepare
from launcher.errors import UserError
from tests.cli import invoke, said
from tests.payloads import pickle_payloads, torch_save_payloads
from tests.unit.train.checkpoint.test_safe_load import data_file, make_run

pytestmark = pytest.mark.unit


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "a.txt").write_text("hello world, " * 50)
    (folder / "b.txt").write_text("another document " * 40)
    return folder


# --- data prepare --------------------------------------------------------------------------------
def test_prepare_overwrite_never_deletes_a_folder_it_did_not_write(
    text_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The reproduction: an index.json of `{}` was enough for --overwrite to delete the folder.
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "index.json").write_text("{}")
    (fake / "precious.txt").write_text("a user's file")
    code, output = said(
        invoke("data", "prepare", "--input", str(text_dir), "--output", str(fake), "--overwrite")
    )
    assert code == 2 and "not a prepared dataset" in output, output
    assert "Traceback" not in output
    assert snapshot(fake) == {"index.json": b"{}", "precious.txt": b"a user's file"}


def test_prepare_overwrite_keeps_a_users_file_put_into_a_prepared_folder(
    text_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "data"
    prepare([text_dir], out)
    assert (out / outputs.MARKER).is_file()
    (out / "precious.txt").write_text("mine")
    before = snapshot(out)
    with pytest.raises(UserError, match=r"did not write: precious\.txt"):
        prepare([text_dir], out, overwrite=True)
    assert snapshot(out) == before
    (out / "precious.txt").unlink()
    prepare([text_dir / "a.txt"], out, overwrite=True)  # its own output: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "text"]


def test_prepare_never_replaces_a_folder_created_while_it_runs(
    text_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "data"
    real = prepare_module.write_splits

    def write_then_someone_creates_the_output(*args: object, **kwargs: object) -> object:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        out.mkdir()
        (out / "precious.txt").write_text("made meanwhile")
        return result

    monkeypatch.setattr(prepare_module, "write_splits", write_then_someone_creates_the_output)
    with pytest.raises(UserError, match="appeared while this command ran"):
        prepare([text_dir], out)
    assert snapshot(out) == {"precious.txt": b"made meanwhile"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "text"]  # no temporary left


def test_prepare_never_replaces_an_empty_folder_created_while_it_runs(
    text_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "data"
    real = prepare_module.write_splits

    def write_then_mkdir(*args: object, **kwargs: object) -> object:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        out.mkdir()
        return result

    monkeypatch.setattr(prepare_module, "write_splits", write_then_mkdir)
    with pytest.raises(UserError, match="appeared while this command ran"):
        prepare([text_dir], out)
    assert out.is_dir() and not any(out.iterdir())


def test_two_concurrent_prepares_into_one_output_one_wins_the_other_fails(
    text_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "data"
    both_written = threading.Barrier(2, timeout=60)
    real = outputs.install

    def install_together(*args: object, **kwargs: object) -> None:
        both_written.wait()  # both have finished writing; both now rename into place
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(outputs, "install", install_together)
    results: list[object] = [None, None]

    def one(i: int, source: Path) -> None:
        try:
            results[i] = prepare([source], out)
        except UserError as exc:
            results[i] = exc

    threads = [
        threading.Thread(target=one, args=(0, text_dir / "a.txt")),
        threading.Thread(target=one, args=(1, text_dir / "b.txt")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    failed = [r for r in results if isinstance(r, UserError)]
    assert len(failed) == 1, results
    assert "appeared while this command ran" in str(failed[0])
    index = json.loads((out / "index.json").read_text())
    assert index["source_files"] == 1 and outputs.why_not_owned(out, prepare_module.COMMAND) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "text"]


# --- export --------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["run", "runs", "checkpoints", "cwd", "dot"])
def test_export_overwrite_never_touches_runs(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path, steps=(1,))
    monkeypatch.chdir(tmp_path)
    out = {
        "run": str(run),
        "runs": str(tmp_path / "runs"),
        "checkpoints": str(run / "checkpoints"),
        "cwd": str(tmp_path),
        "dot": ".",
    }[where]
    before = snapshot(tmp_path)
    for extra in ([], ["--overwrite"]):
        code, output = said(invoke("export", str(run), "--out", out, *extra))
        assert code == 2, output
        assert "Traceback" not in output
        assert snapshot(tmp_path) == before


def test_export_out_dot_in_an_empty_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "elsewhere", steps=(1,))
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    code, output = said(invoke("export", str(run), "--out", "."))
    assert code == 2 and "current" in output and "Traceback" not in output
    assert not any((tmp_path / "empty").iterdir())


def test_export_overwrite_replaces_only_its_own_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path, steps=(1,))
    out = tmp_path / "hf"
    code, output = said(invoke("export", str(run), "--out", str(out)))
    assert code == 0, output
    assert outputs.why_not_owned(out, "llmtrain export") is None
    code, output = said(invoke("export", str(run), "--out", str(out), "--overwrite"))
    assert code == 0, output
    (out / "README.md").write_text("my model card")
    before = snapshot(out)
    code, output = said(invoke("export", str(run), "--out", str(out), "--overwrite"))
    assert code == 2 and "did not write: README.md" in output, output
    assert snapshot(out) == before
    # A prepared dataset is not an export either.
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("some text " * 30)
    prepare([tmp_path / "text"], tmp_path / "data")
    data_before = snapshot(tmp_path / "data")
    code, output = said(invoke("export", str(run), "--out", str(tmp_path / "data"), "--overwrite"))
    assert code == 2 and "llmtrain export" in output
    assert snapshot(tmp_path / "data") == data_before


def test_export_refuses_weights_whose_shape_config_json_would_misdescribe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The reproduction: a resume with a wider model rewrote config.yaml; export then wrote a
    # config.json of the new width beside weights of the old one, exit 0.
    run = make_run(tmp_path, steps=(1,))
    values = yaml.safe_load((run / "config.yaml").read_text())
    assert values["model"]["hidden_size"] == 64
    values["model"]["hidden_size"] = 96
    (run / "config.yaml").write_text(yaml.safe_dump(values))
    code, output = said(invoke("export", str(run), "--out", str(tmp_path / "hf")))
    assert code == 2, output
    words = " ".join(output.split())
    assert "do not fit the model" in words and "config.json" in words
    assert "weights [64], model [96]" in words or "weights [256, 64], model [256, 96]" in words
    assert not (tmp_path / "hf").exists()


# --- refused checkpoints: exit 2, the file's contents never quoted ------------------------------
SECRET = "TOPSECRET-do-not-print"


def rewrite_manifest(folder: Path) -> None:
    """What an attacker without the key can do: rewrite the manifest to match new files."""
    import hashlib

    manifest = json.loads((folder / "manifest.json").read_text())
    total = 0
    for rel in manifest["files"]:
        data = (folder / rel).read_bytes()
        manifest["files"][rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        total += len(data)
    manifest["total_bytes"] = total
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("kind", ["torch", "deepspeed"])
def test_refused_checkpoints_are_exit_2_for_export_and_init_from(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path, kind, steps=(1,))
    marker = tmp_path / "pwned"
    if kind == "torch":
        target = data_file(run, 1, kind).parent / ".metadata"
        payload = next(iter(pickle_payloads(marker).values()))
    else:
        target = data_file(run, 1, kind)
        payload = next(iter(torch_save_payloads(marker).values()))
    target.write_bytes(payload)
    rewrite_manifest(run / "checkpoints" / "step_00000001")
    code, output = said(invoke("export", str(run), "--out", str(tmp_path / "hf")))
    assert code == 2, output
    assert "refused" in output and "Traceback" not in output
    monkeypatch.chdir(tmp_path)
    code, output = said(invoke("run", "model.num_layers=2", f"train.init_from={run}"))
    assert code == 2, output
    assert "train.init_from" in output and "Traceback" not in output
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["torch", "deepspeed"])
def test_messages_never_quote_a_refused_files_contents(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path, kind, steps=(1,))
    target = (
        data_file(run, 1, kind).parent / ".metadata" if kind == "torch" else data_file(run, 1, kind)
    )
    target.write_text(f"root:x:0:0:{SECRET}:/root:/bin/bash\n" * 20)
    rewrite_manifest(run / "checkpoints" / "step_00000001")
    code, output = said(invoke("export", str(run), "--out", str(tmp_path / "hf")))
    assert code == 2 and "Traceback" not in output, output
    assert SECRET not in output and "root:x" not in output
    monkeypatch.chdir(tmp_path)
    code, output = said(invoke("run", "model.num_layers=2", f"train.init_from={run}"))
    assert code == 2 and "Traceback" not in output, output
    assert SECRET not in output and "root:x" not in output
