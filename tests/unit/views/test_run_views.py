"""Runs told apart and pictured, without training: the log-interval line, the screen copy of rank
0's log (a closed pipe turns it off, never raises), command.json (secrets redacted) and the
resume command, what differs between runs, a name several runs begin with, the sparkline, and
`diff`/`status`/`plot` through the real command line on fabricated run folders."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from launcher.config.differences import differences, distinguishing, flat_values
from launcher.errors import UserError
from launcher.launch import console
from launcher.launch.local_runs import CHECKPOINTED, NEWEST, RUNNING, resolve_run
from launcher.launch.run_record import (
    config_values,
    metric_history,
    public_overrides,
    read_command,
    resume_command,
)
from launcher.views.runs import loss_picture, sparkline

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.

RECORD = {
    "typed": ["train.steps=300", "backend=deepspeed"],
    "overrides": [],
    "fresh": False,
    "detach": False,
    "cwd": "/work",
    "time": None,
}


def test_the_interval_line_names_every_figure() -> None:
    pytest.importorskip("torch")
    from launcher.train.reporting.metrics import Interval, interval_line

    record = {
        "step": 40,
        "loss": 4.12345,
        "lr": 3e-4,
        "grad_norm": 0.9123,
        "tokens_per_s": 5120.4,
        "mfu": 0.0123,
        "memory_bytes": 0.41 * 2**30,
    }
    assert interval_line(record, 300, 65, width=200) == (
        "step 40/300 | loss 4.1235 | lr 3.00e-04 | grad norm 0.912 | 5,120 tok/s | MFU 1.2% | "
        "mem 0.41 GiB | eta 1m05s"
    )
    # in 80 columns (the default): the least wanted figures are left out (metrics.jsonl has all)
    assert interval_line(record, 300, 65) == (
        "step 40/300 | loss 4.1235 | grad norm 0.912 | 5,120 tok/s | MFU 1.2% | eta 1m05s"
    )
    bad = {"step": 3, "loss": None, "grad_norm": None, "nonfinite": ["loss", "grad_norm"]}
    assert interval_line(bad, 3, None) == "step 3/3 | loss NOT FINITE | grad norm NOT FINITE"
    assert interval_line({"step": 5, "loss": 1.0, "val_loss": 2.0, "val_ppl": 7.39}, 9, 1).endswith(
        "| eta 1s | val loss 2.0000 (ppl 7.39)"
    )
    interval = Interval(total_steps=10, start_step=0, log_every=4)
    assert [s for s in range(1, 11) if interval.line({"step": s, "loss": 1.0})] == [4, 8, 10]


def test_the_screen_shows_rank0_lines_without_prefix_and_survives_a_closed_pipe(
    tmp_path: Path,
) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("11:00:00 rank0 old line, before this launch\n")
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    follow = console.Follow([log], stream)
    with log.open("a") as f:
        f.write("11:00:01 rank0 step 2/9 | loss 5.0000\n11:00:02 rank0 ERROR: diverged\n")
        f.write("11:00:03 rank0 half a li")
    follow.pump()
    assert os.read(read_end, 1000) == b"step 2/9 | loss 5.0000\n"  # no ERROR, no half line
    os.close(read_end)  # the reader goes away (`| head`)
    with log.open("a") as f:
        f.write("ne\n11:00:04 rank0 step 4/9 | loss 4.0000\n")
    follow.pump()  # EPIPE: the copy stops, nothing raises
    assert not follow.on
    follow.say("stopping")
    follow.finish()
    with contextlib.suppress(BrokenPipeError):  # what the dead pipe still holds
        stream.close()


def test_the_screen_copy_never_waits_on_a_fifo(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    os.mkfifo(log)
    read_end, write_end = os.pipe()
    follow = console.Follow([log], os.fdopen(write_end, "w"))
    follow.pump()  # returns at once: a FIFO is not a log
    follow.finish()
    os.close(read_end)


def test_screen_text() -> None:
    assert console.screen_text("09:10:11 rank0 done: 12 steps") == "done: 12 steps"
    assert console.screen_text("09:10:11 rank0 ERROR: nope") is None
    assert console.screen_text("memory per process: ...") == "memory per process: ..."


def test_secrets_never_reach_command_json() -> None:
    values = {"run": {"secret_env": ["HF_TOKEN"]}, "cluster": {"env": {}}}
    environ = {"HF_TOKEN": "hf_abcdefgh12345"}
    shown = public_overrides(
        [
            "cluster.env.WANDB_API_KEY=k-0123456789",
            "run.name=x-hf_abcdefgh12345",
            "train.steps=5",
        ],
        values,
        environ,
    )
    assert shown == ["cluster.env.WANDB_API_KEY=REDACTED", "run.name=x-REDACTED", "train.steps=5"]


def test_resume_command() -> None:
    folder = Path("/runs/tiny-1234abcd-20261127-120000")
    assert resume_command(RECORD, folder, "/work") == (
        "llmtrain run train.steps=300 backend=deepspeed"
    )
    fresh = {**RECORD, "fresh": True, "detach": True, "typed": ["--config", "my run.yaml"]}
    assert resume_command(fresh, folder, "/elsewhere") == (
        "cd /work && llmtrain run --detach --config 'my run.yaml' "
        "run.name=tiny-1234abcd-20261127-120000"
    )
    assert "same `llmtrain run` command" in resume_command(None, folder)


def test_differences_and_what_tells_runs_apart() -> None:
    a = {"recipe": "tiny", "run": {"name": None}, "backend": {"name": "torch", "compile": False}}
    b = {"recipe": "tiny", "run": {"name": "x"}, "backend": {"name": "deepspeed", "zero_x": 1}}
    a["zero"] = {"stage": 0}
    b["zero"] = {"stage": 3}
    rows = differences(flat_values(a), flat_values(b))
    assert rows == [
        ("backend.compile", "false", "(absent)"),
        ("backend.name", "torch", "deepspeed"),
        ("backend.zero_x", "(absent)", "1"),
        ("run.name", "null", "x"),
        ("zero.stage", "0", "3"),
    ]
    told = distinguishing({"a": flat_values(a), "b": flat_values(b)})
    # backend.* beyond its name follows from it; the run's own name is no difference.
    assert told == {"a": "backend=torch zero.stage=0", "b": "backend=deepspeed zero.stage=3"}
    same = distinguishing({"a": flat_values(a), "c": flat_values(a)})
    assert same["c"] == "(same configuration)"


def test_sparkline() -> None:
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([8, 7, 6, 5, 4, 3, 2, 1]) == "█▇▆▅▄▃▂▁"
    assert sparkline([2.0] * 5) == "▄▄▄▄▄"
    assert sparkline([float("nan")]) == ""
    assert len(sparkline(list(range(1000)), width=40)) == 40
    history = [{"step": s, "loss": 6.0 - s} for s in range(1, 5)]
    assert loss_picture(history) == "loss █▆▃▁ 5.0000 -> 2.0000 (steps 1-4, min 2.0000)"
    assert loss_picture([]) is None


def make_run(
    root: Path, name: str, values: dict[str, object], *, age: float, checkpoint: bool = False
) -> Path:
    folder = root / name
    (folder / "logs").mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(values))
    lines = [json.dumps({"step": s, "loss": 5.0 - s / 10, "lr": 1e-3}) for s in (1, 2, 3)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if checkpoint:
        (folder / "checkpoints" / "step_00000003").mkdir(parents=True)
    then = time.time() - age
    os.utime(folder / "config.yaml", (then, then))
    return folder


def tiny(backend: str, stage: int) -> dict[str, object]:
    return {
        "recipe": "tiny",
        "train": {"steps": 10},
        "backend": {"name": backend},
        "zero": {"stage": stage},
        "cluster": {"gpus_per_node": 2 if stage else 1},
    }


def test_a_name_several_runs_begin_with(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    older = make_run(root, "tiny-0000aaaa", tiny("torch", 0), age=60, checkpoint=True)
    newer = make_run(root, "tiny-1111bbbb", tiny("deepspeed", 3), age=5)
    chosen = resolve_run("tiny", root, NEWEST)
    assert chosen.folder == newer.resolve()
    assert chosen.note is not None
    assert chosen.note.startswith("tiny names 2 runs; using tiny-1111bbbb, the newest")
    assert "backend=deepspeed cluster.gpus_per_node=2 zero.stage=3" in chosen.note
    assert "tiny-0000aaaa (interrupted" in chosen.note
    assert "backend=torch cluster.gpus_per_node=1 zero.stage=0" in chosen.note
    assert resolve_run("tiny", root, CHECKPOINTED).folder == older.resolve()
    assert resolve_run("tiny-0000aaaa", root, NEWEST).note is None  # a full name: that run
    with pytest.raises(UserError, match="none of them, or more than one, is running") as refused:
        resolve_run("tiny", root, RUNNING)
    assert "backend=torch" in str(refused.value) and "llmtrain diff A B" in str(refused.value)


def test_hostile_run_files_are_never_followed_nor_waited_on(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    os.mkfifo(folder / "metrics.jsonl")  # opening it for reading would wait for a writer
    os.mkfifo(folder / "command.json")
    (tmp_path / "elsewhere.yaml").write_text("recipe: tiny\n")
    (folder / "config.yaml").symlink_to(tmp_path / "elsewhere.yaml")
    assert metric_history(folder) == []
    assert read_command(folder) is None
    assert config_values(folder) is None
    (folder / "metrics.jsonl").unlink()
    (folder / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 5.0}\n{"step": 2, "loss": NaN}\n[[[[\n{"step": 2, "loss": 4.0}\n'
    )
    assert metric_history(folder) == [{"step": 1.0, "loss": 5.0}, {"step": 2.0, "loss": 4.0}]


def cli(cwd: Path, *args: str, python: str = "") -> subprocess.CompletedProcess[str]:
    code = (
        python
        + "\nfrom launcher.cli import entry\nimport sys\nsys.argv = ['llmtrain', *%r]\nentry()"
    )
    return subprocess.run(
        [sys.executable, "-c", code % (list(args),)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "250"},
    )


@pytest.mark.integration
def test_status_diff_and_plot_on_two_runs(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    make_run(root, "tiny-0000aaaa", tiny("torch", 0), age=60)
    make_run(root, "tiny-1111bbbb", tiny("deepspeed", 3), age=5)
    status = cli(tmp_path, "status", "tiny")
    assert status.returncode == 0, status.stderr
    assert "note: tiny names 2 runs; using tiny-1111bbbb" in status.stderr
    assert "run tiny-1111bbbb (tiny): interrupted" in status.stdout
    assert "loss █▄▁ 4.9000 -> 4.7000 (steps 1-3" in status.stdout
    diff = cli(tmp_path, "diff", "tiny-0000aaaa", "tiny-1111bbbb", "--json")
    assert diff.returncode == 0, diff.stderr
    keys = {row["key"]: (row["a"], row["b"]) for row in json.loads(diff.stdout)["differences"]}
    assert keys == {
        "backend.name": ("torch", "deepspeed"),
        "cluster.gpus_per_node": ("1", "2"),
        "zero.stage": ("0", "3"),
    }
    # plot imports matplotlib only when it runs, and says what to install without it.
    probe = cli(
        tmp_path,
        "status",
        "tiny-0000aaaa",
        python="import atexit, sys\natexit.register(lambda: print('PLOT', "
        "sorted(m for m in sys.modules if m.startswith(('matplotlib', 'launcher.views.plot')))))",
    )
    assert "PLOT []" in probe.stdout, probe.stdout + probe.stderr
    missing = cli(
        tmp_path,
        "plot",
        "tiny",
        "--out",
        "a.png",
        python="import sys\nsys.modules['matplotlib'] = None",
    )
    assert missing.returncode == 2 and "pip install 'llmtrain[plot]'" in missing.stderr, missing
    assert "Traceback" not in missing.stderr and not (tmp_path / "a.png").exists()
    pytest.importorskip("matplotlib")
    drawn = cli(tmp_path, "plot", "tiny-0000aaaa", "tiny-1111bbbb", "--out", "both.png")
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "both.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    wrong = cli(tmp_path, "plot", "tiny-0000aaaa", "--out", "loss.txt")
    assert wrong.returncode == 2 and ".png, .svg, .pdf" in wrong.stderr


@pytest.mark.integration
def test_a_refused_detached_run_says_why_and_exits_2(tmp_path: Path) -> None:
    # The check happens in the child before it holds anything: its refusal reaches this
    # terminal (or the JSON document) and its exit code is the command's; nothing is written.
    refused = cli(tmp_path, "run", "--detach", "parallel.tp=3")
    assert refused.returncode == 2, refused
    assert (
        "error: the configuration is invalid" in refused.stderr
        and "parallel.tp=3" in refused.stderr
    )
    as_json = cli(tmp_path, "run", "--detach", "--json", "parallel.tp=3")
    document = json.loads(as_json.stdout)
    assert as_json.returncode == 2 and document["exit_code"] == 2
    assert "parallel.tp=3" in document["error"]
    assert not (tmp_path / "runs").exists()
