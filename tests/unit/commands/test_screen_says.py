"""What the screen says, tried as a new user would (issue 43, items 1-6): a dry run and `diff`
reach the resume decision `run` reaches; validate lists a bare word beside the other mistakes; a
name that a `--fresh` run extends resolves to the newest with a note; `runs`, the progress line
and `plan --measure` fit 80 columns; a noise-flagged profile earns no error band; a closed pipe
ends a command quietly. In-process through tests/cli.py's `invoke`, on fabricated run folders."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from launcher.launch.local_runs import NEWEST, resolve_run
from tests.cli import invoke, said

pytestmark = pytest.mark.unit


# -- item 1: the dry run and diff reach the resume decision `run` reaches --------------------------


def started_run(cwd: Path, name: str, *overrides: str) -> Path:
    """A run folder as `llmtrain run run.name=NAME OVERRIDES` leaves it after its first
    checkpoint: the files it writes (render writes the same bytes) and one checkpoint."""
    folder = cwd / "runs" / name
    done = invoke("render", f"run.name={name}", *overrides, "--out", str(folder), cwd=cwd)
    assert done.returncode == 0, done.stderr
    (folder / "checkpoints" / "step_00000003").mkdir(parents=True)
    return folder


def test_a_dry_run_refuses_the_resume_run_refuses(tmp_path: Path) -> None:
    folder = started_run(tmp_path, "det", "train.steps=3")
    before = sorted(p.name for p in folder.rglob("*"))
    code, text = said(invoke("run", "--dry-run", "run.name=det", cwd=tmp_path))
    assert code == 2, text
    assert "run --dry-run: would refuse" in text and "would launch" not in text
    # run's own refusal: the key, the values, and the ways out
    assert "train.steps: 3 -> 200 (not set on this command: the recipe's value)" in text
    assert "llmtrain run run.name=det --allow-config-change" in text
    assert "llmtrain run run.name=det --fresh" in text
    assert "train.steps=3" in text  # the command that resumes it as it was started
    document = json.loads(invoke("run", "--dry-run", "--json", "run.name=det", cwd=tmp_path).stdout)
    assert document["exit_code"] == 2
    assert any("train.steps: 3 -> 200" in r for r in document["refusals"]["run"])
    # the ways out, dry: each is accepted and says what it would do
    allowed = said(
        invoke("run", "--dry-run", "--allow-config-change", "run.name=det", cwd=tmp_path)
    )
    assert allowed[0] == 0, allowed[1]
    assert "would resume det" in allowed[1] and "config_history.jsonl" in allowed[1]
    fresh = said(invoke("run", "--dry-run", "--fresh", "run.name=det", cwd=tmp_path))
    assert fresh[0] == 0 and "a new folder" in fresh[1], fresh[1]
    same = said(invoke("run", "--dry-run", "run.name=det", "train.steps=3", cwd=tmp_path))
    assert same[0] == 0 and "would resume det" in same[1], same[1]
    # submit refuses the same resume
    submitted = said(invoke("submit", "--dry-run", "run.name=det", cwd=tmp_path))
    assert submitted[0] == 2 and "train.steps: 3 -> 200" in submitted[1], submitted[1]
    assert sorted(p.name for p in folder.rglob("*")) == before  # nothing written


def test_diff_says_the_command_would_be_refused_and_why(tmp_path: Path) -> None:
    started_run(tmp_path, "det", "train.steps=3")
    code, text = said(invoke("diff", "det", "run.name=det", cwd=tmp_path))
    assert code == 0, text
    assert "that command resumes det" not in text
    assert "that command would be refused" in text and "train.steps" in text, text
    assert "--allow-config-change" in text and "--fresh" in text
    document = json.loads(invoke("diff", "det", "run.name=det", "--json", cwd=tmp_path).stdout)
    assert document["resumes"] is True and "train.steps: 3 -> 200" in document["refused"]
    fine = said(invoke("diff", "det", "run.name=det", "train.steps=3", cwd=tmp_path))
    assert "that command resumes det" in fine[1] and "refused" not in fine[1], fine[1]


# -- item 2: validate lists a bare word among the other mistakes -----------------------------------


def test_a_bare_word_is_one_more_problem_in_the_list() -> None:
    mistakes = (
        "foo",  # a bare word
        "parallel.tpp=2",  # unknown key
        "optim.lr=fast",  # type
        "checkpoint.keep_last=0",  # range
        "model.num_attention_heads=3",  # does not divide tiny's hidden size 128
        "train.global_batch_size=7",  # not a multiple of micro 8 x dp
    )
    document = json.loads(invoke("validate", *mistakes, "--json").stdout)
    messages = [e["message"] for e in document["errors"]]
    keys = {e["keys"][0] for e in document["errors"] if e["keys"]}
    assert any("'foo'" in m for m in messages), messages
    assert {"parallel.tpp", "optim.lr", "checkpoint.keep_last"} <= keys, messages
    assert {"model.hidden_size", "train.global_batch_size"} <= keys, messages
    # the same list as without the bare word, plus the bare word
    without = json.loads(invoke("validate", *mistakes[1:], "--json").stdout)["errors"]
    assert document["errors"][1:] == without
    code, text = said(invoke("validate", *mistakes))
    assert code == 2 and "6 error(s)" in text, text
    # a bare word that names a recipe still says which override it meant
    assert "recipe=gpt-7b" in said(invoke("validate", "gpt-7b", "optim.lr=fast"))[1]
    assert "optim.lr" in said(invoke("validate", "gpt-7b", "optim.lr=fast"))[1]


# -- item 3: a name that --fresh runs extend -------------------------------------------------------


def fake_run(root: Path, name: str, *, age: float, steps: int = 10) -> Path:
    folder = root / name
    (folder / "logs").mkdir(parents=True)
    values = {"recipe": "tiny", "train": {"steps": steps}, "run": {"name": "b"}}
    (folder / "config.yaml").write_text(yaml.safe_dump(values))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0}) + "\n")
    then = time.time() - age
    os.utime(folder / "config.yaml", (then, then))
    return folder


def test_a_name_resolves_to_its_newest_fresh_run_with_a_note(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    fake_run(root, "b", age=600)
    fresh = fake_run(root, "b-20261128-221045", age=5, steps=20)
    fake_run(root, "bert", age=1)  # another name that begins with b: not a run of name b
    chosen = resolve_run("b", root, NEWEST)
    assert chosen.folder == fresh.resolve()
    assert chosen.note is not None and "using b-20261128-221045, the newest" in chosen.note
    assert "bert" not in chosen.note and f"{root / 'b'}" in chosen.note
    assert resolve_run("bert", root, NEWEST).note is None
    assert resolve_run(str(root / "b"), root, NEWEST).folder == (root / "b").resolve()
    for command in ("status", "logs"):
        done = invoke(command, "b", "--root", str(root), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "note: b names 2 runs (b and the runs --fresh started" in done.stderr, command
        assert "using b-20261128-221045, the newest" in done.stderr, command
    assert "run b-20261128-221045" in invoke("status", "b", "--root", str(root)).stdout
    differ = invoke("diff", "b", "b-20261128-221045", "--root", str(root), cwd=tmp_path)
    assert "using b-20261128-221045" in differ.stderr
    assert "the same configuration" in differ.stdout, differ.stdout
    # cancel stops something: it takes the one running, and here none is
    code, text = said(invoke("cancel", "b", "--root", str(root), cwd=tmp_path))
    assert code == 2 and "none of them, or more than one, is running" in text, text
    assert "b-20261128-221045" in text


# -- item 4: 80 columns ----------------------------------------------------------------------------


def listed_runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for i, status_age in enumerate((900, 600, 5)):
        folder = fake_run(root, f"b-20261128-22104{i}", age=status_age, steps=300)
        command = {
            "command": "run",
            "typed": [
                "run.name=b",
                "--fresh",
                "train.steps=300",
                "model.seq_length=32",
                "train.micro_batch_size=4",
                f"optim.lr=3e-{i + 3}",
            ],
            "overrides": [],
            "fresh": True,
            "detach": False,
            "cwd": str(tmp_path),
            "time": None,
        }
        (folder / "command.json").write_text(json.dumps(command))
    return root


def test_runs_fits_80_columns_and_wide_shows_everything(tmp_path: Path) -> None:
    root = listed_runs(tmp_path)
    narrow = invoke("runs", "--root", str(root), env={"COLUMNS": "80"})
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, narrow.stdout
    assert "…" not in narrow.stdout
    for i in range(3):
        row = next(line for line in lines if line.startswith(f"b-20261128-22104{i} "))
        assert "interrupted" in row and "1/300" in row, row
    assert "optim.lr=3e-4" in narrow.stdout  # overrides on a line of their own
    assert "--wide" in narrow.stdout  # says how to see what it left out
    wide = invoke("runs", "--root", str(root), "--wide", env={"COLUMNS": "80"}).stdout
    assert any(len(line) > 80 for line in wide.splitlines())
    full = invoke("runs", "--root", str(root), env={"COLUMNS": "200"}).stdout
    header = full.splitlines()[0].split()
    assert header == [
        "name", "recipe", "backend", "layout", "status", "step", "loss", "started", "overrides"
    ]  # fmt: skip
    row = next(line for line in full.splitlines() if line.startswith("b-20261128-221042 "))
    assert "interrupted" in row and "optim.lr=3e-5" in row  # one line per run


def test_the_progress_line_fits_80_columns() -> None:
    pytest.importorskip("torch")
    from launcher.train.reporting.metrics import interval_line

    cpu = {
        "step": 22,
        "loss": 5.12345,
        "lr": 3e-4,
        "grad_norm": 0.9123,
        "tokens_per_s": 5120.4,
        "memory_bytes": 0.41 * 2**30,
    }
    gpu = {
        "step": 12000,
        "loss": 2.12345,
        "lr": 3e-4,
        "grad_norm": 12.3456,
        "tokens_per_s": 1_234_567.0,
        "mfu": 0.453,
        "memory_bytes": 75.2 * 2**30,
    }
    for record, total, eta in ((cpu, 300, 65.0), (gpu, 100_000, 45_000.0)):
        line = interval_line(record, total, eta)
        assert len(line) <= 80, line
        assert line.startswith(f"step {record['step']}/{total} | loss ")
        assert "tok/s" in line and "eta " in line, line
    evaluated = interval_line({**gpu, "val_loss": 2.2, "val_ppl": 9.03}, 100_000, 45_000.0)
    assert len(evaluated) <= 80 and "val loss 2.2000" in evaluated, evaluated
    bad = {"step": 3, "loss": None, "grad_norm": None, "nonfinite": ["loss", "grad_norm"]}
    assert interval_line(bad, 3, None) == "step 3/3 | loss NOT FINITE | grad norm NOT FINITE"


def test_the_measure_table_fits_80_columns_without_cutting_a_word() -> None:
    from launcher.launch import measure as measure_mod
    from launcher.plan.hardware import measurement_noise as noise

    m = measure_mod.Measured(
        points=(
            measure_mod.Point(1, 0.1234, 0.2 * 2**30, 0.1, 1.1 * 2**30, 4, spread=0.02),
            measure_mod.Point(2, 12.3456, 0.4 * 2**30, 0.2, 1.2 * 2**30, 4, spread=0.6),
        ),
        layers=32,
        step_s=123.4567,
        per_layer_s=0.2,
        fixed_s=0.01,
        memory_bytes=123.4 * 2**30,
        memory_kind="peak RSS over the runtime's baseline",
        predicted_step_s=99.5,
        predicted_memory_bytes=100.5 * 2**30,
        load=noise.Load(3.0, 2),
    )
    words = measure_mod.table(m, width=10_000).split()
    narrow = measure_mod.table(m, width=80)
    assert max(len(line) for line in narrow.splitlines()) <= 80, narrow
    assert narrow.split() == words  # wrapped between words, never inside one
    wide = measure_mod.table(m, width=200)
    assert any(
        line.startswith("fit: step = ") and "allocated." in line for line in wide.split("\n")
    )


# -- item 5: a noise-flagged profile earns no band -------------------------------------------------


def test_plan_states_no_band_from_a_profile_calibrate_marked_as_noise(tmp_path: Path) -> None:
    from launcher.plan.hardware import profile as prof
    from tests.unit.plan.hardware.test_plan_profile import tiny_profile

    doc = tiny_profile()
    problems = ["GEMM attention wq: repeats spread 80% of their median (limit 25%)"]
    doc["quality"] = {"problems": problems, "forced": True}
    doc["digest"] = prof.digest(doc)
    path = tmp_path / "forced.json"
    path.write_text(json.dumps(doc))
    code, text = said(invoke("plan", f"cluster.profile={path}"))
    assert code == 0, text
    assert "profile-based" not in text and "±10%" not in text and "±11%" not in text, text
    assert "no error band" in text and "noise" in text, text
    assert "cluster.profile=none" in text  # the published figures, and their band
    document = json.loads(invoke("plan", f"cluster.profile={path}", "--json").stdout)
    assert document["time"]["error_band"] is None
    assert "calibrate --force" in document["time"]["pricing"]["note"]
    # a clean profile still earns its band
    del doc["quality"]
    doc["digest"] = prof.digest(doc)
    path.write_text(json.dumps(doc))
    assert "profile-based" in invoke("plan", f"cluster.profile={path}").stdout


# -- item 6: completion and a closed pipe ----------------------------------------------------------


def test_an_override_value_completes_to_values_or_paths_never_anything_else() -> None:
    from launcher.cli_hints import NOTHING, complete_for_bash, complete_override, wants_files

    # bash: `parallel.tp=<TAB>` reaches the program as the words `parallel.tp` `=`; the answer
    # says "nothing", which the completion script turns into no completion at all (not files)
    assert complete_override("=", ["parallel.tp"]) == []
    assert complete_for_bash("=", ["parallel.tp"]) == ["=" + NOTHING]
    assert complete_for_bash("1", ["parallel.tp", "="]) == ["1" + NOTHING]
    assert complete_for_bash("zzz", []) == ["zzz" + NOTHING]  # no key starts so
    assert not wants_files("parallel.tp") and not wants_files("run.name")
    # a few whole numbers within declared bounds are offered as values
    assert complete_for_bash("=", ["zero.stage"]) == ["0", "1", "2", "3"]
    # a key that names a file or folder, and an option's value: the shell's file completion
    assert wants_files("data.path") and wants_files("train.init_from")
    assert wants_files("cluster.profile") and wants_files("model.from_hf")
    assert complete_for_bash("", ["data.path", "="]) == []
    assert complete_for_bash("=", ["--config"]) == []


class _ClosedPipe:
    """stdout whose reader went away (`| head`): every write fails with EPIPE."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError("no file descriptor")


@pytest.mark.parametrize(
    "args",
    [["show"], ["show", "--json"], ["show", "--sources"], ["validate"], ["recipes"]],
    ids=" ".join,
)
def test_a_reader_that_went_away_ends_the_command_quietly(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from launcher.commands import common

    monkeypatch.setattr(common.out, "quiet", False)  # restored afterwards: this console is shared
    # The raw attribute (None: sys.stdout when printing), so that teardown restores None rather
    # than pinning the console to the stream that was sys.stdout at the time.
    monkeypatch.setattr(common.out, "_file", _ClosedPipe())
    done = invoke(*args)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
