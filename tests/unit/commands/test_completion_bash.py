"""Shell completion as bash really asks for it (issue 33, item 6).

bash splits the command line at '=' (COMP_WORDBREAKS), so `llmtrain plan recipe=ll<Tab>` reaches
the program as the words `llmtrain plan recipe = ll` with the cursor in the fifth, and bash then
replaces only `ll`. These tests call the installed `llmtrain` the way the completion script that
`llmtrain --install-completion` writes calls it (COMP_WORDS / COMP_CWORD), and, where tmux is
installed, type into a real interactive bash and read the screen.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.rundir import RunDir

pytestmark = pytest.mark.integration  # each test starts processes

ROOT = Path(__file__).resolve().parents[3]

LLMTRAIN = str(Path(sys.executable).with_name("llmtrain"))


def bash_completes(words: list[str], cword: int, cwd: Path | None = None) -> list[str]:
    env = dict(os.environ)
    env.update(
        _LLMTRAIN_COMPLETE="complete_bash", COMP_WORDS=" ".join(words), COMP_CWORD=str(cword)
    )
    done = subprocess.run(
        [LLMTRAIN], env=env, capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_values_after_an_equals_sign_complete_as_bash_splits_them() -> None:
    # `llmtrain plan recipe=ll<Tab>`
    shipped = sorted(p.stem for p in (ROOT / "recipes").glob("ll*.yaml"))
    assert {"llama3-1b", "llama3-405b", "llama3-70b", "llama3-8b"} <= set(shipped)
    assert bash_completes(["llmtrain", "plan", "recipe", "=", "ll"], 4) == shipped
    # `cluster=h1<Tab>`: bare values (bash keeps `cluster=` and replaces `h1`)
    cluster = bash_completes(["llmtrain", "plan", "cluster", "=", "h1"], 4)
    assert "h100-80gb" in cluster and all(c.startswith("h1") for c in cluster)
    # `recipe=<Tab>`: the cursor is in the word "=" itself
    recipes = bash_completes(["llmtrain", "validate", "recipe", "="], 3)
    assert "tiny" in recipes and "llama3-70b" in recipes
    # a fixed-choice key's values, after an earlier override
    assert bash_completes(
        ["llmtrain", "plan", "recipe", "=", "tiny", "zero.offload_optimizer", "=", ""], 7
    ) == ["none", "cpu"]
    # keys still complete (one word: no '=' typed yet)
    assert "parallel.tp=" in bash_completes(["llmtrain", "plan", "parallel.t"], 2)
    # after a finished override, a new word offers keys again
    assert "zero=" in bash_completes(["llmtrain", "plan", "recipe", "=", "tiny", ""], 5)


def test_run_names_complete_for_status_logs_cancel_and_export(tmp_path: Path) -> None:
    for name in ("tiny-20260101-1", "tiny-20260102-1", "gpt-20260103-1"):
        RunDir(tmp_path / "runs" / name).config.parent.mkdir(parents=True)
        RunDir(tmp_path / "runs" / name).config.write_text("{}\n")
    (tmp_path / "runs" / "tiny-notes").mkdir()  # a folder that is not a run directory
    for command in ("status", "logs", "cancel", "export"):
        assert bash_completes(["llmtrain", command, "tiny"], 2, cwd=tmp_path) == [
            "tiny-20260101-1",
            "tiny-20260102-1",
        ], command
    other = tmp_path / "elsewhere"
    (other / "run-a").mkdir(parents=True)
    RunDir(other / "run-a").config.write_text("{}\n")
    assert bash_completes(["llmtrain", "status", "--root", str(other), "run"], 4, cwd=tmp_path) == [
        "run-a"
    ]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_a_real_interactive_bash_completes_recipe_and_cluster(tmp_path: Path) -> None:
    server = f"llmtrain-test-{os.getpid()}"
    bin_dir = Path(sys.executable).parent
    env = {
        "HOME": str(tmp_path),
        "TERM": "xterm",
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "LLMTRAIN_NO_CACHE": "1",
        # the package under test, where it is not the installed one (a worktree)
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
    }
    shell = "env -i " + " ".join(f"{k}={v}" for k, v in env.items())
    tmux = ["tmux", "-L", server]
    (tmp_path / "notes.txt").write_text("")  # a file bash's default completion would offer
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "t", "-x", "200", "-y", "10", "-c", str(tmp_path),
         f"{shell} bash --norc --noprofile -i"],
        check=True, timeout=30,
    )  # fmt: skip

    def screen() -> str:
        return subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", "t"], capture_output=True, text=True, check=True
        ).stdout

    def wait_for(text: str) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if text in screen():
                return screen()
            time.sleep(0.2)
        return screen()

    try:
        wait_for("bash")
        keys = 'eval "$(_LLMTRAIN_COMPLETE=source_bash llmtrain)"; echo READY'
        subprocess.run([*tmux, "send-keys", "-t", "t", keys, "Enter"], check=True)
        assert "READY" in wait_for("\nREADY")
        # a unique prefix (llama3-70b is also the start of llama3-70b-lora and -qlora)
        subprocess.run([*tmux, "send-keys", "-t", "t", "llmtrain plan recipe=llama3-40", "Tab"])
        assert "recipe=llama3-405b" in wait_for("recipe=llama3-405b")
        subprocess.run([*tmux, "send-keys", "-t", "t", "cluster=h100-8", "Tab"])
        # the recipe completed with a space after it (tmux trims a line's trailing spaces)
        assert "recipe=llama3-405b cluster=h100-80gb" in wait_for("cluster=h100-80gb")
        # a key completes to `parallel.tp=` with no space after it: the value follows directly
        subprocess.run([*tmux, "send-keys", "-t", "t", "parallel.t", "Tab"])
        wait_for("parallel.tp=")
        # no value to offer: nothing, never the files of the current directory (issue 43)
        subprocess.run([*tmux, "send-keys", "-t", "t", "Tab", "Tab"])
        time.sleep(1.0)
        assert "notes.txt" not in screen(), screen()
        subprocess.run([*tmux, "send-keys", "-t", "t", "8"])
        assert "cluster=h100-80gb parallel.tp=8" in wait_for("parallel.tp=8")
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, timeout=30)
