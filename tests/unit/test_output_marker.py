"""Issue 30, item 1: --overwrite deletes only what llmtrain provably wrote.

The reproduction: a folder holding a copy of a run (with its checkpoints) four levels down and a
user's notes.txt, plus a hand-written `.llmtrain-output.json` listing every file: `llmtrain export
RUN --out deep --overwrite` exited 0 and deleted all of it (the run scan stopped at depth 3, the
marker was unsigned). Now the marker is signed with the user's key and lists sizes and sha256,
the whole tree is searched for runs (or the folder refused), and a file added or changed after
the check is never deleted.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
from pathlib import Path

import pytest

from launcher import output_marker, outputs
from launcher.data.prepare import COMMAND as PREPARE
from launcher.data.prepare import prepare
from launcher.errors import UserError
from tests.cli import invoke, said
from tests.unit.test_outputs import snapshot
from tests.unit.train.checkpoint.test_safe_load import make_run

pytestmark = pytest.mark.unit


def forged_marker(folder: Path, command: str, fmt: str, key: bytes | None) -> None:
    """A marker listing every file of `folder` as the attacker computes it (sizes, sha256), in
    the old unsigned format or the new one signed with a key of the attacker's."""
    files = {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }
    if fmt == "v1":
        document: dict[str, object] = {
            "format": "llmtrain-output-v1",
            "command": command,
            "files": sorted(files),
        }
    else:
        listed = {
            r: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for r, d in files.items()
        }
        document = {"format": output_marker.FORMAT, "command": command, "files": listed}
        if key is not None:
            body = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
            document["hmac_sha256"] = hmac.new(key, body, hashlib.sha256).hexdigest()
    (folder / output_marker.MARKER).write_text(json.dumps(document))


@pytest.mark.parametrize("fmt", ["v1", "v2-unsigned", "v2-other-key"])
def test_a_forged_marker_never_gets_a_run_deleted(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path, steps=(1,))
    deep = tmp_path / "deep"
    shutil.copytree(run, deep / "a" / "b" / "c" / "myrun")
    (deep / "notes.txt").write_text("my notes")
    key = b"attacker-key-" * 4 if fmt == "v2-other-key" else None
    forged_marker(deep, "llmtrain export", fmt.split("-")[0], key)
    before = snapshot(deep)
    code, output = said(invoke("export", str(run), "--out", str(deep), "--overwrite"))
    assert code == 2, output
    assert "Traceback" not in output and "myrun" in output, output
    assert snapshot(deep) == before


@pytest.mark.parametrize("fmt", ["v1", "v2-unsigned", "v2-other-key"])
def test_a_forged_marker_never_gets_a_users_files_deleted(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No run inside: only the marker's signature stands between the user's files and deletion.
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("some text " * 30)
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("my notes")
    (mine / "sub" / "thesis.tex").write_text("\\documentclass{article}")
    key = b"attacker-key-" * 4 if fmt == "v2-other-key" else None
    forged_marker(mine, PREPARE, fmt.split("-")[0], key)
    before = snapshot(mine)
    args = ["--input", str(tmp_path / "text"), "--output", str(mine), "--overwrite"]
    code, output = said(invoke("data", "prepare", *args))
    assert code == 2 and "Traceback" not in output, output
    assert "not provably written by llmtrain" in output or "not of format" in output, output
    assert snapshot(mine) == before


def test_a_run_at_any_depth_is_found(tmp_path: Path) -> None:
    out = tmp_path / "out"
    deep = out.joinpath(*"abcdefghij")  # ten levels down
    (deep / "checkpoints").mkdir(parents=True)
    (deep / "config.yaml").write_text("recipe: tiny\n")
    with pytest.raises(UserError, match="holds the run directory"):
        outputs.check_target(out, "--out", "llmtrain export", True, "a model folder")


def test_a_tree_too_large_to_search_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outputs, "_SCAN_LIMIT", 50)
    out = tmp_path / "out"
    out.mkdir()
    for i in range(60):
        (out / f"f{i}").write_text("x")
    with pytest.raises(UserError, match="cannot be searched whole"):
        outputs.check_target(out, "--out", "llmtrain export", True, "a model folder")
    assert len(list(out.iterdir())) == 60


@pytest.fixture
def prepared(tmp_path: Path) -> tuple[Path, Path]:
    text = tmp_path / "text"
    text.mkdir()
    (text / "a.txt").write_text("hello world, " * 50)
    out = tmp_path / "data"
    prepare([text], out)
    return text, out


def test_the_marker_is_signed_and_lists_sizes_and_hashes(prepared: tuple[Path, Path]) -> None:
    _, out = prepared
    document, problem = output_marker.read(out)
    assert document is not None, problem
    for rel, meta in document["files"].items():
        data = (out / rel).read_bytes()
        assert meta == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert isinstance(document["hmac_sha256"], str)
    key_file = output_marker.key_file()
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_a_file_created_between_check_and_replace_is_never_deleted(
    prepared: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    text, out = prepared
    real = outputs.install

    def someone_adds_a_file(*args: object, **kwargs: object) -> None:
        (out / "late.txt").write_text("written after the check")
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(outputs, "install", someone_adds_a_file)
    before = None
    with pytest.raises(UserError, match="changed while this command ran"):
        before = snapshot(out)
        prepare([text], out, overwrite=True)
    assert before is not None and (out / "late.txt").read_text() == "written after the check"
    assert output_marker.read(out)[0] is not None  # the earlier dataset is there, untouched
    assert sorted(p.name for p in out.parent.iterdir()) == ["data", "text"]


def test_a_file_added_or_changed_between_check_and_delete_is_kept(
    prepared: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    text, out = prepared
    real = outputs.remove_owned
    touched: list[Path] = []

    def someone_writes_into_the_old_folder(folder: Path) -> list[str]:
        (folder / "late.txt").write_text("added after the check")
        listed = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != outputs.MARKER)
        listed[0].write_bytes(b"changed after the check")
        touched.extend([folder / "late.txt", listed[0]])
        return real(folder)

    monkeypatch.setattr(outputs, "remove_owned", someone_writes_into_the_old_folder)
    with pytest.raises(UserError, match="were kept there"):
        prepare([text], out, overwrite=True)
    assert output_marker.read(out)[0] is not None  # the new dataset is in place
    assert touched[0].read_text() == "added after the check"
    assert touched[1].read_bytes() == b"changed after the check"
    left = sorted(p.relative_to(touched[0].parent).as_posix() for p in touched[0].parent.rglob("*"))
    assert left == sorted(p.name for p in touched), left  # everything else was removed
