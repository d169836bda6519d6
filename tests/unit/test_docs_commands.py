"""Every command README.md and docs/*.md show runs, as shown, through the real command line.

What is executed: each `llmtrain ...` line of a fenced ```bash block (a trailing `# comment` is
dropped, `\\` continuations are joined, `a && b` / `a; b` are separate commands) and each
`$ llmtrain ...` line of a plain fenced block (a transcript: the lines shown under it must be in
its output, `...` standing for what is left out). Commands run one page at a time, in the order
shown, in a fresh folder holding what a reader of that page has (see `prepare`), through the
console entry point (tests/cli.py `invoke`), so exit codes and stderr are what a user sees:
- `run` and `submit` (they would train or call sbatch) run as their `--dry-run --json` form: no
  configuration error, and the only refusals allowed are the machine's own
  (no CUDA GPUs here, one node, no SLURM client, no Megatron-LM checkout);
- `logs --follow` runs without `--follow` (it would wait for the run to end);
- every other command must exit 0, except a line whose comment says `(exits 2)`;
- no command may print a traceback.
Commands that need a trained run (`export`, and those that read its `exported/` folder) run
against a real run in tests/integration/test_export_run.py; `test_every_command_is_run` checks
that each command is run by one of the two.

The other lines of bash blocks (pip, venv, pytest) are not run: they are checked against
pyproject.toml and .ci/run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cli import invoke

# Unit tests (tests/conftest.py marks them); the pages that start processes are marked integration.
# A command of a page that takes longer than this fails instead of hanging the suite.
TIMEOUT_S = 300

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Refusals that say this machine is not the one the command is for, not that the example is wrong.
MACHINE = re.compile(
    r"CUDA GPUs|a local run uses this machine only|Megatron-LM checkout|sbatch not found"
)


@dataclass(frozen=True)
class Shown:
    """One command as a page shows it."""

    page: str
    line: int  # 1-based line of the page
    args: tuple[str, ...]  # after `llmtrain`
    expect_exit: int = 0
    output: tuple[str, ...] = ()  # a transcript's expected lines
    transcript: bool = False

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}: llmtrain {shlex.join(self.args)}"


@dataclass
class Page:
    name: str
    commands: list[Shown] = field(default_factory=list)
    others: list[tuple[int, list[str]]] = field(default_factory=list)  # non-llmtrain commands
    files: dict[str, str] = field(default_factory=dict)  # ```yaml blocks opening with `# NAME`


def fenced_blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(info string, line number of the block's first line, lines) of each fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            info, start, body = lines[i][3:].strip(), i + 2, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            yield info, start, body
        i += 1


def split_commands(line: str) -> list[list[str]]:
    """The commands of one shell line: words, comments dropped, split at && ; |."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    for word in lexer:
        if word in ("&&", ";", "||", "|"):
            commands.append([])
        else:
            commands[-1].append(word)
    return [c for c in commands if c]


def is_llmtrain(word: str) -> bool:
    return word == "llmtrain" or word.endswith("/llmtrain")


def read_page(path: Path) -> Page:
    page = Page(str(path.relative_to(ROOT)))
    for info, start, body in fenced_blocks(path.read_text()):
        if info.split()[:1] == ["bash"]:
            logical: list[tuple[int, str]] = []
            for offset, raw in enumerate(body):
                if logical and logical[-1][1].endswith("\\"):
                    logical[-1] = (logical[-1][0], logical[-1][1][:-1] + " " + raw.strip())
                else:
                    logical.append((start + offset, raw))
            for number, text in logical:
                exits = 2 if "(exits 2)" in text else 0
                for words in split_commands(text):
                    if is_llmtrain(words[0]):
                        page.commands.append(
                            Shown(page.name, number, tuple(words[1:]), expect_exit=exits)
                        )
                    else:
                        page.others.append((number, words))
        elif info.split()[:1] == ["yaml"] and body and body[0].startswith("# "):
            page.files[body[0][2:].strip()] = "\n".join(body) + "\n"
        elif info == "":
            for offset, raw in enumerate(body):
                if raw.startswith("$ "):
                    words = split_commands(raw[2:])[0]
                    assert is_llmtrain(words[0]), f"{page.name}:{start + offset}: {raw}"
                    page.commands.append(
                        Shown(page.name, start + offset, tuple(words[1:]), transcript=True)
                    )
                elif page.commands and page.commands[-1].transcript and offset > 0:
                    last = page.commands[-1]
                    page.commands[-1] = Shown(
                        last.page,
                        last.line,
                        last.args,
                        expect_exit=2 if raw.startswith("error") else last.expect_exit,
                        output=(*last.output, raw),
                        transcript=True,
                    )
    return page


ALL = [read_page(p) for p in PAGES]


def needs_trained_run(shown: Shown) -> bool:
    """A command that reads a trained run's checkpoints (or what export made of them)."""
    return shown.args[:1] == ("export",) or any("exported/" in a for a in shown.args)


def as_executed(shown: Shown) -> list[str]:
    """The command line that is run for `shown` (see the module docstring)."""
    args = list(shown.args)
    if args[:1] in (["run"], ["submit"]):
        rest = [a for a in args[1:] if a not in ("--dry-run", "--json")]
        args = [args[0], "--dry-run", "--json", *rest]
    if args[:1] == ["logs"]:
        args = [a for a in args if a not in ("--follow", "-f")]
    return args


def check(shown: Shown, done: subprocess.CompletedProcess[str]) -> None:
    """The verdict on one executed command; raises AssertionError naming the page line."""
    said = done.stdout + done.stderr
    assert "Traceback" not in said, f"{shown.where}: a traceback\n{said[-3000:]}"
    executed = as_executed(shown)
    if "--dry-run" in executed and "--json" in executed:
        try:
            verdict = json.loads(done.stdout)
        except ValueError:
            raise AssertionError(f"{shown.where}: not a JSON verdict\n{said[-3000:]}") from None
        assert verdict.get("errors") == [] and verdict.get("valid") is True, (
            f"{shown.where}: configuration errors {verdict.get('errors') or verdict}"
        )
        refusals = verdict["refusals"][executed[0]]
        wrong = [r for r in refusals if not MACHINE.search(r)]
        assert not wrong, f"{shown.where}: refused for more than this machine: {wrong}"
        assert done.returncode == (2 if refusals else 0), f"{shown.where}: exit {done.returncode}"
        return
    assert done.returncode == shown.expect_exit, (
        f"{shown.where}: exit {done.returncode}, expected {shown.expect_exit}\n{said[-3000:]}"
    )
    flat = " ".join(said.split())
    for expected in shown.output:
        position = 0
        for piece in (" ".join(p.split()) for p in expected.split("...")):
            found = flat.find(piece.strip(" ,"), position) if piece.strip(" ,") else position
            assert found >= 0, f"{shown.where}: the page shows {expected!r}, it printed\n{said}"
            position = found


# --- what a reader of the pages has -----------------------------------------------------------

# A Hugging Face config.json as Meta publishes it for Llama 3.1 8B (the fields llmtrain reads).
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}


def text_files() -> Iterator[Path]:
    """Python's own sources as text to tokenize (what the tiny recipe's corpus is made of)."""
    yield from sorted(Path(os.__file__).parent.glob("[a-m]*.py"))


def make_inputs(where: Path) -> None:
    """The inputs docs/data.md's commands name: folders and files of text, JSON Lines records,
    and a tokenizer.json (made by the page's own `--tokenizer bpe` command, see `prepare`)."""
    sources = [p.read_text(errors="replace") for p in text_files()][:60]
    for folder, chunk in (
        ("notes", sources[:10]),
        ("corpus", sources[10:40]),
        ("code", sources[40:50]),
    ):
        (where / folder).mkdir()
        for i, text in enumerate(chunk):
            (where / folder / f"{i}.txt").write_text(text)
    (where / "book.txt").write_text("\n\n".join(sources[50:]))
    records = [{"text": part} for text in sources for part in text.split("\n\n") if part.strip()]
    (where / "web.jsonl").write_text("\n".join(json.dumps(r) for r in records[:2000]) + "\n")


def fabricate_run(where: Path, name: str, recipe: str, slurm_job: str | None = None) -> Path:
    """A run folder with the files `llmtrain runs/status/logs` read: a run that did 20 of its 200
    steps (no checkpoints: commands that need them run against a real run, in integration)."""
    folder = where / "runs" / name
    (folder / "logs").mkdir(parents=True)
    (folder / "config.yaml").write_text(f"recipe: {recipe}\ntrain:\n  steps: 200\n")
    lines = [json.dumps({"step": s, "loss": 5.5 - s / 100}) for s in range(10, 30, 10)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "logs" / "rank0.log").write_text(
        "step 10/200  loss 5.4000\nstep 20/200  loss 5.3000\n"
    )
    if slurm_job is not None:
        (folder / "slurm.json").write_text(json.dumps({"job_ids": [slurm_job], "submissions": []}))
        (folder / "logs" / f"slurm-{slurm_job}.out").write_text("step 20/200  loss 5.3000\n")
        (folder / "logs" / f"slurm-{slurm_job}.err").write_text("")
    return folder


def stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def fake_slurm(bin_dir: Path, run: Path, job: str) -> None:
    """Stand-ins for the SLURM client (no cluster can exist in the unit tier; tests/slurm runs the
    real one): scontrol knows one finished job of `run`, squeue lists nothing, scancel succeeds."""
    bin_dir.mkdir()
    line = (
        f"JobId={job} JobName=llama3-70b JobState=COMPLETED Reason=None NodeList=node[001-256] "
        f"RunTime=00:10:00 Restarts=0 ExitCode=0:0 StdOut={run}/logs/slurm-{job}.out "
        f"StdErr={run}/logs/slurm-{job}.err"
    )
    stub(bin_dir, "scontrol", f'[ "$2" = job ] && echo "{line}"\nexit 0\n')
    stub(bin_dir, "squeue", "exit 0\n")
    stub(bin_dir, "scancel", "exit 0\n")


# The lock taken as `llmtrain run` takes it (runlock.acquire: its record proves the launcher, so
# `cancel` signals it; a process that only takes the flock is never signalled).
HOLDER = """
import signal, sys, time
from launcher.launch import runlock
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
lock = runlock.acquire(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def hold_lock(folder: Path) -> subprocess.Popen[str]:
    """A process holding the run's lock as a live `llmtrain run` does (a stand-in: a real run is an
    integration test, tests/integration/test_local_runs.py); Ctrl-C (what cancel sends) ends it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def default_run_name() -> str:
    """The folder `llmtrain run` (the default recipe) makes, as `llmtrain runs` lists it."""
    from launcher.config.composition.compose import compose_config
    from launcher.launch.local import run_dir_for

    return run_dir_for(compose_config([])).name


def starts_processes(page: Page) -> bool:
    """Whether running the page starts processes (see `prepare`): a stand-in run holding its
    lock (`cancel tiny`), stub SLURM clients (`status`/`cancel` of a SLURM run)."""
    names = {a for c in page.commands for a in c.args[1:2]}
    return bool(names & {"tiny", "llama3-70b"})


def prepare(page: Page, where: Path) -> tuple[dict[str, str], list[subprocess.Popen[str]]]:
    """The page's folder as its reader has it; returns the changes to the environment and the
    started processes."""
    env = {"NO_COLOR": "1", "COLUMNS": "200"}
    for name, text in page.files.items():
        (where / name).write_text(text)
    (where / "Llama-3.1-8B").mkdir()
    (where / "Llama-3.1-8B" / "config.json").write_text(json.dumps(LLAMA_31_8B))
    make_inputs(where)
    started: list[subprocess.Popen[str]] = []
    names = {a for c in page.commands for a in c.args[1:2]}
    tiny = fabricate_run(where, default_run_name(), "tiny")
    if "tiny" in names:
        started.append(hold_lock(tiny))  # `cancel tiny` stops a running run
    if "llama3-70b" in names:
        job = "4242"
        run = fabricate_run(where, "llama3-70b-0123abcd", "llama3-70b", slurm_job=job)
        fake_slurm(where / "slurm-bin", run, job)
        env["PATH"] = f"{where / 'slurm-bin'}:{os.environ['PATH']}"
    return env, started


def leave_run_behind(shown: Shown, done: subprocess.CompletedProcess[str]) -> None:
    """A `run` the page shows (run here as --dry-run) that this machine would start leaves its
    run directory, as the reader who runs the page has it: the files the dry run names, and a
    few steps of metrics. So `status tiny` after the page's second tiny run meets two runs."""
    if shown.args[:1] != ("run",) or "--dry-run" in shown.args or done.returncode != 0:
        return
    document = json.loads(done.stdout)
    folder = Path(document["run_dir"])
    if folder.exists():
        return
    (folder / "logs").mkdir(parents=True)
    for name in ("config.yaml", "plan.json", "launch.sh"):
        if name in document["files"]:
            (folder / name).write_text(document["files"][name])
    lines = [json.dumps({"step": s, "loss": 5.5 - s / 100}) for s in range(10, 30, 10)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "logs" / "rank0.log").write_text("12:00:00 rank0 step 10/200 | loss 5.4000\n")


def run_page(page: Page, where: Path, only: list[Shown]) -> list[str]:
    """Run `only` (commands of `page`) in order in `where`; the failures, one line each."""
    env, started = prepare(page, where)
    failures = []
    try:
        for shown in only:
            if shown.args[:4] == ("data", "prepare", "--input", "web.jsonl"):
                # The page's tokenizer.json: the BPE its previous command trained.
                target = where / "models" / "llama3" / "tokenizer.json"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes((where / "data" / "bpe" / "tokenizer.json").read_bytes())
            done = invoke(*as_executed(shown), cwd=where, env=env, timeout=TIMEOUT_S)
            try:
                check(shown, done)
            except AssertionError as exc:
                failures.append(str(exc))
            else:
                leave_run_behind(shown, done)
    finally:
        for process in started:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
            process.wait()
    return failures


RUN_HERE = [p for p in ALL if any(not needs_trained_run(c) for c in p.commands)]


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(p, id=p.name, marks=[pytest.mark.integration] if starts_processes(p) else [])
        for p in RUN_HERE
    ],
)
def test_every_command_of_the_page_runs(page: Page, tmp_path: Path) -> None:
    here = [c for c in page.commands if not needs_trained_run(c)]
    failures = run_page(page, tmp_path, here)
    assert not failures, "\n\n".join(failures)


def test_every_command_is_run() -> None:
    shown = [c for p in ALL for c in p.commands]
    # Nothing is left out by the extraction: every `llmtrain` word at the start of a line of a bash
    # block or transcript is a command above.
    for page in PAGES:
        for info, start, body in fenced_blocks(page.read_text()):
            if info.split()[:1] == ["bash"] or info == "":
                for offset, raw in enumerate(body):
                    text = raw.strip().removeprefix("$ ")
                    if re.match(r"(\S*/)?llmtrain\s", text + " "):
                        assert any(
                            c.page == str(page.relative_to(ROOT)) and c.line == start + offset
                            for c in shown
                        ), f"{page.name}:{start + offset}: {raw} is not run"
    assert len(shown) >= 40
    integration = (ROOT / "tests" / "integration" / "test_export_run.py").read_text()
    assert "needs_trained_run" in integration  # the trained-run half runs them


def test_install_and_test_lines_match_pyproject_and_ci() -> None:
    readme = next(p for p in ALL if p.name == "README.md")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = set(pyproject["project"]["optional-dependencies"])
    markers = {m.split(":")[0] for m in pyproject["tool"]["pytest"]["ini_options"]["markers"]}
    ci = (ROOT / ".ci" / "run").read_text()
    lines = {n for n, _ in readme.others}
    assert lines, "README shows its install commands"
    for page in ALL:
        for number, words in page.others:
            where = f"{page.name}:{number}: {shlex.join(words)}"
            if words[:3] == ["python3", "-m", "venv"]:
                assert words[3:] == [".venv"], where
            elif words[0].endswith("pip") and "install" in words:
                for spec in words[words.index("install") + 1 :]:
                    if spec.startswith("-"):
                        continue
                    match = re.fullmatch(r"(?:-e )?(?:\.|llmtrain)\[([a-z,]+)\]", spec)
                    assert match, f"{where}: installs {spec!r}, not this project with its extras"
                    assert set(match.group(1).split(",")) <= extras, where
            # Scripts it names exist; pytest markers it selects are declared.
            for word in words:
                if word.endswith(".py") and not word.startswith("/"):
                    assert (ROOT / word).is_file(), f"{where}: no {word}"
            if "pytest" in words and "-m" in words[words.index("pytest") :]:
                marker = words[words.index("-m", words.index("pytest")) + 1]
                assert marker in markers, f"{where}: no pytest marker {marker!r}"
    # CI runs exactly README's second command.
    text = (ROOT / "README.md").read_text()
    test_line = next(
        line
        for line in text.splitlines()
        if line.startswith("python3 -m venv") and "pytest" in line
    )
    assert test_line in ci.splitlines(), "README's test command is not .ci/run's"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_links_between_the_pages_resolve() -> None:
    """README's contents and every relative link of README.md and docs/ name a page that exists
    and, after `#`, one of its headings."""
    anchors = {
        page: {
            slug(line.lstrip("#"))
            for line in page.read_text().splitlines()
            if re.match(r"#{1,6} ", line)
        }
        for page in PAGES
    }
    checked = 0
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            assert linked.exists(), f"{page.name}: link to {target}: no such file"
            if anchor:
                assert anchor in anchors.get(linked, set()), f"{page.name}: {target}: no heading"
            checked += 1
    assert checked >= 20


def test_readme_is_a_front_page() -> None:
    """README: at most 15 KB, contents first, how overrides work before any calibration figure,
    a link to every docs/ page."""
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 15 * 1024
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Contents"
    assert text.index("## How overrides work") < min(
        text.find(word) % (len(text) + 1) for word in ("leave-one-source-out", "calibration.csv")
    )
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in text, f"README does not link docs/{page.name}"
