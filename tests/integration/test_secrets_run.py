"""Secrets end to end: `llmtrain run` hands them to real torchrun ranks, and neither value appears
in any file of the run directory (binary ones too), in the compose cache, or in what `run`, `show`,
`show --sources`, `show --json`, `validate`, `plan` and `render` print or write.

How the test knows the ranks got the right values without the launcher writing them anywhere: a
``sitecustomize`` module on PYTHONPATH runs in every Python process; in a torchrun worker (RANK
and LOCAL_RANK set) it compares the sha256 of each secret with the expected one and writes
ok/mismatch/missing to a probe folder outside the run directory. No test hook in llmtrain itself.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tests.cli import invoke, llmtrain

pytestmark = pytest.mark.integration

KEY, TOKEN = "s3cr3t-VALUE-123", "tok-VALUE-456"
SHORT = ["train.steps=3", "model.seq_length=64", "train.micro_batch_size=4"]
SECRETS = ["run.secret_env=[MY_API_KEY]", f"+cluster.env.HF_TOKEN={TOKEN}"]

PROBE = """
import hashlib, os
if "RANK" in os.environ and "LOCAL_RANK" in os.environ and "SECRET_PROBE_DIR" in os.environ:
    seen = []
    for name in ("MY_API_KEY", "HF_TOKEN"):
        value = os.environ.get(name)
        want = os.environ["SECRET_PROBE_SHA_" + name]
        ok = value is not None and hashlib.sha256(value.encode()).hexdigest() == want
        seen.append(name + "=" + ("ok" if ok else "missing" if value is None else "mismatch"))
    path = os.path.join(os.environ["SECRET_PROBE_DIR"], "rank" + os.environ["RANK"])
    with open(path, "w") as f:
        f.write(" ".join(seen))
"""


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def leaks(root: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            if KEY.encode() in data or TOKEN.encode() in data:
                found.append(str(path))
    return found


def test_secrets_reach_the_ranks_and_are_never_written_or_printed(tmp_path: Path) -> None:
    probe_code, probe_out, work, xdg = (tmp_path / n for n in ("site", "probe", "work", "xdg"))
    for folder in (probe_code, probe_out, work):
        folder.mkdir()
    (probe_code / "sitecustomize.py").write_text(PROBE)
    env: dict[str, str | None] = {
        "MY_API_KEY": KEY,
        # Every cache lands here and is checked too: the compose cache and the built-in corpus
        # (prepared here, a second or two).
        "LLMTRAIN_CACHE": None,
        "XDG_CACHE_HOME": str(xdg),
        "HF_TOKEN": None,
        "LLMTRAIN_NO_CACHE": None,
    }
    # The ranks' probe (sitecustomize.py) records what reached them.
    probe = {
        "PYTHONPATH": str(probe_code),
        "SECRET_PROBE_DIR": str(probe_out),
        "SECRET_PROBE_SHA_MY_API_KEY": sha(KEY),
        "SECRET_PROBE_SHA_HF_TOKEN": sha(TOKEN),
    }

    def printed(done: subprocess.CompletedProcess[str]) -> str:
        assert done.returncode == 0, (done.args, done.stderr[-3000:])
        said = done.stdout + done.stderr
        assert KEY not in said and TOKEN not in said, (done.args, said)
        return said

    def llmtrain_in_process(*args: str) -> str:
        return printed(invoke(*args, cwd=work, env=env))

    ran = printed(
        llmtrain("run", *SHORT, "cluster.gpus_per_node=2", *SECRETS, cwd=work, env={**env, **probe})
    )
    assert "secret env: MY_API_KEY, HF_TOKEN set" in ran
    assert sorted(p.name for p in probe_out.iterdir()) == ["rank0", "rank1"]
    for probe in probe_out.iterdir():
        assert probe.read_text() == "MY_API_KEY=ok HF_TOKEN=ok", probe.name
    (run_dir,) = (work / "runs").iterdir()
    assert "secret env: MY_API_KEY, HF_TOKEN set" in (run_dir / "logs" / "rank1.log").read_text()
    assert "HF_TOKEN: '***'" in (run_dir / "config.yaml").read_text()
    assert (run_dir / "summary.json").is_file()

    assert "***" in llmtrain_in_process("show", *SECRETS)
    assert "***" in llmtrain_in_process("show", "--sources", *SECRETS)
    assert "***" in llmtrain_in_process("show", "--json", *SECRETS)
    llmtrain_in_process("validate", *SECRETS)
    llmtrain_in_process("validate", "--json", *SECRETS)
    llmtrain_in_process("plan", *SECRETS)
    llmtrain_in_process("plan", "--json", *SECRETS)
    llmtrain_in_process("render", "cluster.num_nodes=2", *SHORT, *SECRETS, "--out", "rendered")
    sbatch = (work / "rendered" / "job.sbatch").read_text()
    assert "for name in MY_API_KEY HF_TOKEN; do" in sbatch

    assert leaks(work) == []  # the run directory, the rendered folder, everything else here
    assert leaks(xdg) == []
