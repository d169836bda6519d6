"""Issue 30, part A: nothing hangs, nothing is deleted, no traceback, whatever the files hold.

Each test is one of the issue's reproductions in its most hostile form: a FIFO in a run file's
place (every run command), a stranger holding a run's flock (cancel), profiles that never end or
claim impossible speed, messages quoting files, a full disk under `data prepare`, a secret pulled
in with ${oc.env:...}. The forged output marker of item 1 is in tests/unit/test_output_marker.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.rundir import RunDir
from tests.cli import invoke, llmtrain, said

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.


# Every command here must end within seconds; one that blocks (on a FIFO, say) is stopped after
# this long and fails its test (exit 124) instead of hanging the suite.
TIMEOUT_S = 10


def make_run(root: Path, name: str, steps: int = 3) -> Path:
    """A finished-looking local run directory: config.yaml, plan.json, metrics.jsonl, a log."""
    run = root / name
    (run / "logs").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    (run / "config.yaml").write_text(f"recipe: tiny\ntrain:\n  steps: {steps}\n")
    (run / "plan.json").write_text(json.dumps({"totals": {"steps": steps}}))
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 5.0 - s}) + "\n" for s in range(1, steps + 1))
    )
    (run / "logs" / "rank0.log").write_text("rank0 training tiny\n")
    (run / "summary.json").write_text("{}")
    return run


# --- item 2: a FIFO in a run file's place blocks nothing ------------------------------------------
@pytest.mark.parametrize("name", ["slurm.json", "metrics.jsonl", "plan.json", ".llmtrain.lock"])
def test_a_fifo_run_file_hangs_no_run_command(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runs"
    make_run(root, "good")
    bad = make_run(root, "x")
    target = bad / name
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    for command in (["status", "x"], ["logs", "x"], ["cancel", "x"], ["status", "x", "--json"]):
        code, output = said(invoke(*command, "--root", str(root), timeout=TIMEOUT_S))
        assert code in (0, 2), (command, output)
        assert "Traceback" not in output, output
    code, output = said(invoke("runs", "--root", str(root), "--json", timeout=TIMEOUT_S))
    assert code == 0, output
    listed = {r["name"]: r for r in json.loads(output)["runs"]}
    assert listed["good"]["status"] == "done" and listed["good"]["step"] == 3
    if name in ("slurm.json", "metrics.jsonl"):
        assert listed["x"]["status"] == "unreadable", listed["x"]
        assert any(name in p and "FIFO" in p for p in listed["x"]["problems"]), listed["x"]
        code, output = said(invoke("status", "x", "--root", str(root), timeout=TIMEOUT_S))
        assert code == 0 and "unreadable" in output and "FIFO" in output, output


def test_a_fifo_rank_log_is_refused_by_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runs"
    run = make_run(root, "x")
    (run / "logs" / "rank0.log").unlink()
    os.mkfifo(run / "logs" / "rank0.log")
    for extra in ([], ["--json"]):
        code, output = said(invoke("logs", "x", "--root", str(root), *extra, timeout=TIMEOUT_S))
        assert code == 2 and "not a regular file" in output and "Traceback" not in output, output


# --- item 4: cancel signals only the run's own launcher ---------------------------------------
HOLD = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(1000)\n"
)


def _stranger(lock: Path, how: str) -> subprocess.Popen[str]:
    if how == "script":
        args = [sys.executable, "-c", HOLD, str(lock)]
    else:
        args = ["flock", str(lock), "sh", "-c", "echo held; exec sleep 1000"]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


@pytest.mark.integration
@pytest.mark.parametrize("how", ["script", "flock"])
@pytest.mark.parametrize("record", ["stale", "forged"])
def test_cancel_never_signals_a_stranger_holding_the_lock(
    how: str, record: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if how == "flock" and not Path("/usr/bin/flock").exists():
        pytest.skip("flock(1) is not installed")
    root = tmp_path / "runs"
    run = make_run(root, "x")
    lock = RunDir(run).lock
    # The record an earlier, finished llmtrain run left behind (its pid long gone).
    record_of_a_finished_run = {
        "pid": 999_999,
        "host": socket.gethostname(),
        "time": time.time() - 3600,
        "token": "0123456789abcdef",
    }
    lock.write_text(json.dumps(record_of_a_finished_run))
    stranger = _stranger(lock, how)
    try:
        if record == "forged":  # the stranger rewrites the record with its own pid and start
            forged = {
                "pid": stranger.pid,
                "host": socket.gethostname(),
                "time": time.time(),
                "start": int(
                    Path(f"/proc/{stranger.pid}/stat").read_text().rpartition(")")[2].split()[19]
                ),
                "boot": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
                "token": "0123456789abcdef",
            }
            lock.write_text(json.dumps(forged))
        started = time.monotonic()
        code, output = said(invoke("cancel", "x", "--root", str(root), timeout=20))
        took = time.monotonic() - started
        assert code == 2, output
        assert "nothing was signalled" in output and "Traceback" not in output, output
        assert took < 15, took  # refused at once (a wait would take 120 s; invoke stops at 20)
        time.sleep(0.2)
        assert stranger.poll() is None, "the stranger was signalled"
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.integration
def test_cancel_signals_the_proven_launcher(tmp_path: Path) -> None:
    # A real launcher: a process that takes the run's lock through runlock.acquire and waits for
    # SIGINT (as `llmtrain run` does); cancel proves it and stops it.
    root = tmp_path / "runs"
    run = make_run(root, "x")
    code = (
        "import signal, sys, time\n"
        "from launcher.launch import runlock\n"
        f"lock = runlock.acquire({str(run)!r})\n"
        "print('held', flush=True)\n"
        "try:\n"
        "    time.sleep(60)\n"
        "except KeyboardInterrupt:\n"
        "    lock.release(); sys.exit(130)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None and launcher.stdout.readline().strip() == "held"
        done = llmtrain("cancel", "x", "--root", str(root), timeout=60)
        assert done.returncode == 0, done.stderr
        assert "stopped" in done.stdout, done.stdout
        assert launcher.wait(timeout=10) == 130
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


# --- item 3: profiles are read bounded, and their figures must be physically possible ------------
def _profile(tmp_path: Path, **changes: object) -> Path:
    from launcher.plan.hardware import profile as prof
    from tests.unit.plan.hardware.test_plan_profile import tiny_profile

    doc = tiny_profile()
    for section, value in changes.items():
        doc[section] = value
    doc["digest"] = prof.digest(doc)  # anyone can recompute it
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(doc))
    return path


def _plan(capsys: pytest.CaptureFixture[str], profile: str) -> tuple[int, str]:
    return said(invoke("plan", "recipe=tiny", f"cluster.profile={profile}", timeout=TIMEOUT_S))


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "sparse-500MB", "folder", "symlink-to-zero"])
def test_a_profile_that_never_ends_is_refused_at_once(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "profile.json"
    if kind == "dev-zero":
        path = Path("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "sparse-500MB":
        with open(path, "wb") as f:
            f.truncate(500 << 20)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    # Refused from what the file is (stat), before a byte is read: the reason names it. A read
    # that never ends would instead hit the TIMEOUT_S guard of `invoke`.
    reason = {
        "dev-zero": "character device, not a regular file",
        "fifo": "FIFO (named pipe), not a regular file",
        "sparse-500MB": "larger than 16,777,216 bytes (524,288,000 bytes)",
        "folder": "a folder, not a regular file",
        "symlink-to-zero": "character device, not a regular file",
    }[kind]
    code, output = _plan(capsys, str(path))
    assert code == 2, output
    assert "cluster.profile=" in output and "Traceback" not in output, output
    assert reason in output, output


@pytest.mark.parametrize(
    "figure", [1e-300, -1e-3, float("nan"), float("inf"), 0.0, 1e300, "1e-3", True]
)
def test_a_profile_with_impossible_timings_is_refused(
    figure: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.unit.plan.hardware.test_plan_profile import tiny_profile

    gemms = tiny_profile()["gemm"]
    gemms[1] = {**gemms[1], "fwd_s": figure}
    code, output = _plan(capsys, str(_profile(tmp_path, gemm=gemms)))
    assert code == 2, output
    said = " ".join(output.split())
    assert "cluster.profile=" in said and "gemm[1].fwd_s" in said, said
    assert "Traceback" not in output


def test_a_forged_fast_profile_never_predicts_an_impossible_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The reproduction: every timing 1e-300 s, digest recomputed; plan predicted a 7e-299 s step.
    from tests.unit.plan.hardware.test_plan_profile import tiny_profile

    doc = tiny_profile()
    for section in ("gemm", "attention", "elementwise", "loss"):
        doc[section] = [{**e, "fwd_s": 1e-300, "bwd_s": 1e-300} for e in doc[section]]
    doc["optimizer"] = [{**e, "seconds": 1e-300} for e in doc["optimizer"]]
    path = _profile(tmp_path, **{k: doc[k] for k in ("gemm", "attention", "elementwise", "loss")})
    code, output = _plan(capsys, str(path))
    assert code == 2 and "faster than" in output and "Traceback" not in output, output


# --- item 8: errors about files name the key, with at most a short escaped excerpt --------------
HUGE = "\x1b[2J\x1b[31m" + "A" * 20_000


def test_profile_errors_never_quote_a_file_at_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from launcher.plan.hardware import profile as prof
    from tests.unit.plan.hardware.test_plan_profile import tiny_profile

    cases = []
    version = tiny_profile()
    version["version"] = HUGE
    cases.append(version)
    device = tiny_profile()
    device["device"] = {**device["device"], "cluster_gpu": HUGE, "name": HUGE}
    cases.append(device)
    kind = tiny_profile()
    kind["attention"][0]["kind"] = HUGE
    cases.append(kind)
    number = tiny_profile()
    number["loss"][0]["vocab"] = HUGE
    cases.append(number)
    for i, doc in enumerate(cases):
        doc["digest"] = prof.digest(doc)
        path = tmp_path / f"p{i}.json"
        path.write_text(json.dumps(doc))
        code, output = _plan(capsys, str(path))
        assert code == 2 and "Traceback" not in output, output
        assert "\x1b" not in output and "A" * 100 not in output, output[:300]
        assert len(output) < 2000, len(output)


LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "vocab_size": 256,
}


@pytest.mark.parametrize(
    "change",
    [
        {"model_type": HUGE},
        {"hidden_act": HUGE},
        {"num_hidden_layers": HUGE},
        {"num_attention_heads": [HUGE] * 3},
        {"num_attention_heads": 0},
        {"hidden_size": 1e308},
        {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": HUGE},
    ],
    ids=["model_type", "hidden_act", "layers", "heads-list", "heads-zero", "huge", "n_inner"],
)
def test_from_hf_errors_never_quote_the_file_at_length(
    change: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "n_positions": 128, **change}))
    code, output = said(invoke("show", f"model.from_hf={path}", timeout=TIMEOUT_S))
    assert code == 2 and "model.from_hf" in output and "Traceback" not in output, output
    assert "\x1b" not in output and "A" * 100 not in output, output[:300]
    assert len(output) < 2000, len(output)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "sparse"])
def test_from_hf_reads_a_config_json_that_never_ends_bounded(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero-link":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as f:
            f.truncate(100 << 20)
    code, output = said(invoke("show", f"model.from_hf={tmp_path}", timeout=5))
    assert code == 2 and "model.from_hf" in output and "Traceback" not in output, output


# --- item 9: a value read from the environment is never cached, and secret names are secrets ------
def _cached_texts(cache: Path) -> str:
    return "".join(p.read_text() for p in cache.rglob("*.json")) if cache.exists() else ""


@pytest.mark.parametrize("name", ["SECRET", "HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD"])
def test_a_secret_named_variable_is_never_shown_or_cached(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    value = "hunter2-do-not-print-7f3a"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LLMTRAIN_CACHE", raising=False)  # it would win
    monkeypatch.delenv("LLMTRAIN_NO_CACHE", raising=False)
    monkeypatch.setenv(name, value)
    code, output = said(invoke("show", f"run.name=${{oc.env:{name}}}", timeout=TIMEOUT_S))
    assert code == 2, output
    assert "run.name" in output and name in output and value not in output, output
    assert value not in _cached_texts(tmp_path / "cache")


def test_an_environment_value_is_never_written_to_the_compose_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    value = "plain-value-from-the-environment"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LLMTRAIN_CACHE", raising=False)  # it would win
    monkeypatch.delenv("LLMTRAIN_NO_CACHE", raising=False)
    monkeypatch.setenv("RUN_LABEL", value)
    for _ in range(2):  # the second would be served from the cache
        code, output = said(invoke("show", "run.name=${oc.env:RUN_LABEL}", timeout=TIMEOUT_S))
        assert code == 0 and value in output, output
    assert value not in _cached_texts(tmp_path / "cache")
    code, output = said(
        invoke("show", "run.name=plain", timeout=TIMEOUT_S)
    )  # others are still cached
    assert code == 0 and "plain" in _cached_texts(tmp_path / "cache")


# --- item 8: data prepare onto a full disk says so, no traceback ---------------------------------
def _can_mount() -> bool:
    import shutil

    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.mark.integration
@pytest.mark.skipif(not _can_mount(), reason="mounting a small tmpfs needs root")
def test_data_prepare_onto_a_full_disk_says_disk_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import random
    import uuid

    text = tmp_path / "in.txt"
    rng = random.Random(0)
    text.write_text(" ".join("".join(rng.choices("abcdefgh", k=6)) for _ in range(200_000)))
    mount = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {done.stderr.decode().strip()}")
    try:
        for fmt in ("megatron", "shards"):
            out = mount / "data"
            args = ["data", "prepare", "--input", str(text), "--output", str(out), "--format", fmt]
            code, output = said(invoke(*args, timeout=TIMEOUT_S))
            assert code == 2, output
            words = " ".join(output.split())
            assert "disk full writing" in words and "--output" in words, words
            assert "Traceback" not in output and "checkpoint" not in words, words
            assert list(mount.iterdir()) == []  # no temporary folder left behind
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_chat_templates_and_config_files_are_read_bounded(tmp_path: Path) -> None:
    """A FIFO given as a chat template or an HF index, or as --config, is refused at once."""
    import time

    from launcher.config.composition.config_file import read_yaml_file
    from launcher.config.schema import LLMTrainConfig
    from launcher.data.templating.chat_template import ChatTemplate
    from launcher.errors import ConfigError, UserError
    from launcher.train.checkpoint.init_from import problems

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(UserError, match=r"is a FIFO \(named pipe\), not a regular file"):
        ChatTemplate.from_tokenizer_config(tmp_path / "none.json", template_file=fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_yaml_file(fifo, "--config")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    os.mkfifo(model / "model.safetensors.index.json")
    cfg = LLMTrainConfig()
    cfg.train.init_from = str(model)
    # Preflight reads the shapes alone, and never waits on the FIFO.
    (problem,) = problems(cfg)
    assert problem.startswith(f"train.init_from={model}: "), problem
    assert time.monotonic() - start < 5
