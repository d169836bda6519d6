"""Property-based: hostile bytes, sizes and file kinds in every file the CLI reads (issue 30).

Each example puts one generated file (random bytes, invalid UTF-8, JSON nested thousands deep, a
valid-looking document with 20 KB / ANSI-escape / NaN values) of one generated kind (a regular
file, a FIFO, a symbolic link to /dev/zero, a folder, a 100 MB sparse file) where llmtrain reads
one: an operator profile (`plan cluster.profile=`), a model's config.json (`show
model.from_hf=`), a safetensors file whose header may lie about its length, dtypes, shapes and
offsets (`validate train.init_from=`), a run file (status.json, slurm.json, metrics.jsonl,
config.yaml, the lock's record, a rank's log: `runs`, `status`, `logs`, `cancel`), a checkpoint
manifest (`export`), an output marker (`data prepare --overwrite`), a `data prepare` input. The
command must end within a few seconds with exit 2 (or 0 where the file may be valid, or for a
listing), print no traceback and no escape character from the file, and write nothing: every file
present before is there after, unchanged.

The commands run in this process through the console entry point (SIGALRM ends one that blocks);
one example runs the real entry point in a child process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli import invoke as cli_invoke
from tests.cli import llmtrain

# unit tests (no marker: tests/conftest.py); the one in a child process is marked integration

LIMIT_S = 8
KINDS = ("regular", "fifo", "zero-link", "folder", "sparse")
ESC = "\x1b[2J"


# --- what goes into the file ---------------------------------------------------------------------
def _deep(n: int, close: bool) -> bytes:
    return b"[" * n + (b"]" * n if close else b"")


HOSTILE_VALUES = st.one_of(
    st.just(ESC + "A" * 20_000),
    st.just(float("nan")),
    st.just(1e-300),
    st.just(-1),
    st.just(10**30),
    st.text(max_size=50),
    st.lists(st.integers(), max_size=5),
)


@st.composite
def json_document(draw: st.DrawFn) -> bytes:
    """A JSON object whose keys may be the ones llmtrain reads, with hostile values."""
    keys = st.sampled_from(
        [
            "schema", "version", "device", "gemm", "model_type", "hidden_size",
            "num_attention_heads", "job_ids", "step", "loss", "format", "command", "files",
            "hmac_sha256", "pid", "token", "start", "recipe", "train", "text",
        ]
    )  # fmt: skip
    body = draw(st.dictionaries(keys, HOSTILE_VALUES, max_size=6))
    text = json.dumps(body, allow_nan=True)
    return text.encode()


CONTENT = st.one_of(
    st.binary(max_size=512),
    st.binary(max_size=64).map(lambda b: b"\xff\xfe\xc3(" + b),
    st.builds(_deep, st.integers(33, 200_000), st.booleans()),
    json_document(),
    json_document().map(lambda b: b + b"\n" + b),
)


# --- running a command ---------------------------------------------------------------------------
def invoke(args: list[str], cwd: Path) -> tuple[int, str]:
    """(exit code, stdout + stderr) of the console entry point in this process (tests/cli.py): a
    traceback is exit 1 and a command blocked past LIMIT_S exit 124, the traceback in the output."""
    done = cli_invoke(*args, cwd=cwd, timeout=LIMIT_S)
    return done.returncode, done.stdout + done.stderr


def place(path: Path, kind: str, content: bytes) -> None:
    """Put a file of `kind` holding `content` (where it can hold any) at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "regular":
        path.write_bytes(content)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero-link":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
        (path / "inside").write_bytes(content)
    else:
        with open(path, "wb") as f:
            f.write(content)
            f.truncate(100 << 20)


def state(root: Path) -> dict[str, str]:
    """Every entry under `root`: its kind, and a regular file's sha256 (FIFOs are never opened)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            mode = os.lstat(full).st_mode
            rel = str(full.relative_to(root))
            if stat.S_ISREG(mode):
                with open(full, "rb") as f:
                    found[rel] = hashlib.sha256(f.read(1 << 20)).hexdigest()
            elif stat.S_ISLNK(mode):
                found[rel] = "link:" + os.readlink(full)
            else:
                found[rel] = "dir" if stat.S_ISDIR(mode) else "other"
    return found


def check(code: int, output: str, allowed: tuple[int, ...], before: dict[str, str], root: Path):
    assert code in allowed, (code, output[-3000:])
    assert "Traceback" not in output, output[-3000:]
    assert "\x1b[2J" not in output and "A" * 200 not in output, output[:500]
    after = state(root)
    assert {k: v for k, v in after.items() if k in before} == before, "a file was changed"


FUZZ = settings(
    max_examples=12,
    deadline=20_000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)


# --- the files ------------------------------------------------------------------------------------
@FUZZ
@given(content=CONTENT, kind=st.sampled_from(KINDS))
def test_profiles(content: bytes, kind: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        place(root / "profile.json", kind, content)
        before = state(root)
        args = ["plan", "recipe=tiny", f"cluster.profile={root / 'profile.json'}"]
        check(*invoke(args, root), (2,), before, root)


@FUZZ
@given(content=CONTENT, kind=st.sampled_from(KINDS))
def test_from_hf_config_json(content: bytes, kind: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        place(root / "model" / "config.json", kind, content)
        before = state(root)
        code, output = invoke(["show", f"model.from_hf={root / 'model'}"], root)
        check(code, output, (0, 2), before, root)


# --- safetensors headers (issue 42): lengths, dtypes, shapes and offsets that lie ---------------
DTYPES = st.sampled_from(["F32", "BF16", "I64", "BOOL", "F4", "Q8", "", 7, None])
DIM = st.one_of(st.integers(0, 70), st.integers(-3, -1), st.just(100_000), st.just(10**20))


@st.composite
def safetensors_bytes(draw: st.DrawFn) -> bytes:
    """A safetensors file whose header may lie: its length field, a tensor's dtype, shape or
    offsets, a field missing, metadata that is not strings; or one whose offsets are consistent
    (checked by the header rules, then refused by the model's shapes)."""
    names = st.sampled_from(["wte.weight", "h.0.ln_1.weight", ESC + "A" * 300, "x"])
    consistent = draw(st.booleans())
    header: dict[str, object] = {}
    position = 0
    for name in draw(st.lists(names, max_size=3, unique=True)):
        dtype = draw(DTYPES)
        shape = draw(st.lists(DIM, max_size=3))
        if consistent:
            size = {"F32": 4, "BF16": 2, "I64": 8, "BOOL": 1}.get(str(dtype), 1)
            shape = [min(abs(d), 64) for d in shape if isinstance(d, int)]
            nbytes = math.prod(shape) * size
            offsets: object = [position, position + nbytes]
            position += nbytes
        else:
            offsets = draw(st.lists(st.integers(-1, 10**13), max_size=3))
        entry = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        if draw(st.booleans()) and not consistent:
            entry.pop(draw(st.sampled_from(sorted(entry))))
        header[name] = entry
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.sampled_from([{"format": "pt"}, {"a": 1}, [ESC]]))
    text = json.dumps(header).encode() if draw(st.integers(0, 9)) else draw(st.binary(max_size=64))
    body = b"\0" * position if consistent else draw(st.binary(max_size=256))
    length = draw(
        st.one_of(st.just(len(text)), st.just(2**60), st.integers(0, 2**64 - 1), st.just(0))
    )
    return struct.pack("<Q", length) + text + body


@FUZZ
@given(content=safetensors_bytes(), kind=st.sampled_from(("regular", "regular", *KINDS[1:])))
def test_safetensors_headers(content: bytes, kind: str) -> None:
    """`validate train.init_from=` (what `run` checks before it starts a process) on a folder
    whose model.safetensors is generated: exit 0 with the refusal as a note, or exit 2, never a
    traceback, a hang or a huge allocation."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "model").mkdir()
        (root / "model" / "config.json").write_text(
            json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 4})
        )
        place(root / "model" / "model.safetensors", kind, content)
        before = state(root)
        args = ["validate", f"train.init_from={root / 'model'}"]
        code, output = invoke(args, root)
        check(code, output, (0, 2), before, root)
        assert "train.init_from" in output, output[-2000:]


RUN_FILES = (
    "slurm.json",
    "metrics.jsonl",
    "config.yaml",
    "summary.json",
    "preempted.json",
    "plan.json",
    ".llmtrain.lock",
    "logs/rank0.log",
    "logs/rank0.error.json",
    "logs/torchrun.log",
)


def _run_dir(root: Path, name: str) -> Path:
    run = root / "runs" / name
    (run / "logs").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    (run / "config.yaml").write_text("recipe: tiny\ntrain:\n  steps: 3\n")
    (run / "metrics.jsonl").write_text('{"step": 3, "loss": 1.5}\n')
    (run / "summary.json").write_text("{}")
    (run / "logs" / "rank0.log").write_text("training\n")
    return run


@FUZZ
@given(content=CONTENT, kind=st.sampled_from(KINDS), target=st.sampled_from(RUN_FILES))
def test_run_files(content: bytes, kind: str, target: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _run_dir(root, "good")
        bad = _run_dir(root, "x")
        with contextlib.suppress(FileNotFoundError):
            (bad / target).unlink()
        place(bad / target, kind, content)
        before = state(root)
        code, output = invoke(["runs", "--json", "--root", str(root / "runs")], root)
        check(code, output, (0,), before, root)
        listed = {r["name"]: r for r in json.loads(output)["runs"]}
        assert listed["good"]["status"] == "done", listed  # one bad run never spoils the others
        for command in (["status", "x"], ["logs", "x"], ["cancel", "x"], ["logs", "x", "--json"]):
            code, output = invoke([*command, "--root", str(root / "runs")], root)
            check(code, output, (0, 2), before, root)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with one real (signed) checkpoint, made once."""
    from tests.unit.train.checkpoint.test_safe_load import make_run

    return make_run(tmp_path_factory.mktemp("trained"), steps=(1,))


@settings(FUZZ, max_examples=8)
@given(content=CONTENT, kind=st.sampled_from(KINDS))
def test_checkpoint_manifests(trained: Path, content: bytes, kind: str) -> None:
    import shutil

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run = root / "runs" / "t"
        shutil.copytree(trained, run)
        manifest = run / "checkpoints" / "step_00000001" / "manifest.json"
        manifest.unlink()
        place(manifest, kind, content)
        before = state(root)
        for extra in ([], ["--step", "1"]):
            args = ["export", str(run), "--out", str(root / "hf"), *extra]
            check(*invoke(args, root), (2,), before, root)
            assert not (root / "hf").exists()


@FUZZ
@given(content=CONTENT, kind=st.sampled_from(KINDS))
def test_output_markers(content: bytes, kind: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "text").mkdir()
        (root / "text" / "a.txt").write_text("some text " * 30)
        out = root / "out"
        out.mkdir()
        (out / "notes.txt").write_text("a user's file")
        place(out / ".llmtrain-output.json", kind, content)
        before = state(root)
        args = ["data", "prepare", "--input", str(root / "text"), "--output", str(out)]
        check(*invoke([*args, "--overwrite"], root), (2,), before, root)


@FUZZ
@given(
    content=CONTENT,
    kind=st.sampled_from(KINDS),
    suffix=st.sampled_from([".txt", ".jsonl", ".json"]),
)
def test_data_prepare_inputs(content: bytes, kind: str, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source = root / f"input{suffix}"
        place(source, kind, content)
        before = state(root)
        for given_path in (source, root):  # the file, and the folder holding it
            out = root / "out"
            code, output = invoke(
                ["data", "prepare", "--input", str(given_path), "--output", str(out)], root
            )
            check(code, output, (0, 2), before, root)
            if code == 2:
                assert not out.exists()
            else:
                import shutil

                shutil.rmtree(out)


@pytest.mark.integration
def test_a_fifo_run_file_in_a_child_process(tmp_path: Path) -> None:
    """The real entry point: `runs` and `status` with a FIFO slurm.json end at once."""
    _run_dir(tmp_path, "good")
    bad = _run_dir(tmp_path, "x")
    os.mkfifo(bad / "slurm.json")
    for args in (["runs"], ["status", "x"]):
        done = llmtrain(*args, "--root", str(tmp_path / "runs"), timeout=30)
        assert done.returncode == 0, done.stderr
        assert "unreadable" in done.stdout and "Traceback" not in done.stderr, done.stdout
