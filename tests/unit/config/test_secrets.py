"""Secrets (launcher.config.secrets): detection by name, redaction of every printed or written copy
of the config, the values handed over through the environment only, a missing one refused."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.secrets import (
    REDACTED,
    SECRET_WORDS,
    is_secret_name,
    mask_secret_overrides,
    public_env,
    redact,
    secret_env,
    secret_names,
    secret_status,
)
from launcher.errors import ConfigError, UserError
from launcher.launch.local import prepare_run_dir
from launcher.launch.render_out import write_artifacts
from launcher.render.artifacts import render_artifacts
from launcher.render.sbatch import RenderError, job_env
from tests.cli import llmtrain

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.

KEY, TOKEN = "s3cr3t-VALUE-123", "tok-VALUE-456"
TWO_NODES = ["cluster.num_nodes=2", "train.micro_batch_size=4"]
SECRETS = ["run.secret_env=[MY_API_KEY]", f"+cluster.env.HF_TOKEN={TOKEN}", "+cluster.env.PLAIN=p"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A compose cache of this test's own, enabled, to prove secrets never land in it."""
    cache = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("LLMTRAIN_CACHE", raising=False)  # it would win
    monkeypatch.delenv("LLMTRAIN_NO_CACHE", raising=False)
    monkeypatch.setenv("MY_API_KEY", KEY)
    return cache


def leaks(root: Path) -> list[str]:
    """Files under root holding either value (bytes, so binary files count too)."""
    return [
        str(p)
        for p in root.rglob("*")
        if p.is_file() and (KEY.encode() in p.read_bytes() or TOKEN.encode() in p.read_bytes())
    ]


@pytest.mark.parametrize(
    "name",
    [
        "WANDB_API_KEY",
        "HF_TOKEN",
        "aws_secret_access_key",
        "DB_PASSWORD",
        "PASSWD",
        "GCP_CREDENTIALS",
    ],
)
def test_secret_looking_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["NCCL_IB_DISABLE", "OMP_NUM_THREADS", "PLAIN", "WANDB_PROJECT"])
def test_ordinary_names(name: str) -> None:
    assert not is_secret_name(name)


def test_the_word_list_is_the_documented_one() -> None:
    assert SECRET_WORDS == ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


def test_composed_values_are_redacted_and_the_config_keeps_the_value() -> None:
    composed = compose_config(SECRETS)
    assert composed.values["cluster"]["env"] == {"HF_TOKEN": REDACTED, "PLAIN": "p"}
    assert composed.values["run"]["secret_env"] == ["MY_API_KEY"]
    assert composed.config.cluster.env["HF_TOKEN"] == TOKEN
    assert secret_names(composed.config) == ["MY_API_KEY", "HF_TOKEN"]
    assert public_env(composed.config) == {"PLAIN": "p"}


def test_redact_is_a_deep_copy_and_honours_secret_env_names() -> None:
    values = {
        "cluster": {"env": {"HF_TOKEN": TOKEN, "MY_VAR": KEY, "PLAIN": "p"}},
        "run": {"secret_env": ["MY_VAR"]},
    }
    out = redact(values)
    assert out["cluster"]["env"] == {"HF_TOKEN": REDACTED, "MY_VAR": REDACTED, "PLAIN": "p"}
    assert values["cluster"]["env"]["HF_TOKEN"] == TOKEN  # the input is left alone
    assert redact({"cluster": {"env": {}}}) == {"cluster": {"env": {}}}
    assert redact({}) == {}


def test_a_composition_holding_a_secret_is_never_cached(private_cache: Path) -> None:
    compose_config(SECRETS)
    compose_config(SECRETS)
    compose_config(["run.secret_env=[MY_API_KEY]"])  # no value in the config: cached as usual
    assert len(list((private_cache / "llmtrain" / "compose").glob("*.json"))) == 1
    assert leaks(private_cache) == []


def test_secret_env_takes_values_from_the_environment_and_cluster_env() -> None:
    cfg = compose_config(SECRETS).config
    assert secret_env(cfg, {"MY_API_KEY": KEY, "HF_TOKEN": "ignored"}) == {
        "MY_API_KEY": KEY,
        "HF_TOKEN": TOKEN,
    }
    with pytest.raises(UserError, match="MY_API_KEY not set") as info:
        secret_env(cfg, {})
    assert info.value.exit_code == 2


def test_an_invalid_secret_name_is_refused() -> None:
    cfg = compose_config(["run.secret_env=['BAD NAME']"]).config
    with pytest.raises(UserError, match="'BAD NAME' is not an environment variable name"):
        secret_names(cfg)


def test_a_missing_secret_stops_run_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MY_API_KEY")
    composed = compose_config([*SECRETS, f"run.root_dir={tmp_path / 'runs'}"])
    with pytest.raises(UserError, match="MY_API_KEY"):
        prepare_run_dir(composed, {}, fresh=False)
    assert not (tmp_path / "runs").exists()


def test_the_run_directory_names_secrets_but_holds_no_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    composed = compose_config([*SECRETS, f"run.root_dir={tmp_path / 'runs'}"])
    prepared = prepare_run_dir(composed, {"plan": 1}, fresh=False)
    prepared.release()
    assert prepared.secrets == {"MY_API_KEY": KEY, "HF_TOKEN": TOKEN}
    assert prepared.env["PLAIN"] == "p" and "HF_TOKEN" not in prepared.env
    assert KEY not in repr(prepared) and TOKEN not in repr(prepared)
    assert leaks(tmp_path / "runs") == []
    script = (prepared.run_dir / "launch.sh").read_text()
    assert "for name in MY_API_KEY HF_TOKEN; do" in script and "export PLAIN=p" in script
    # A rotated key is the same run (the name's hash sees the redacted config).
    monkeypatch.setenv("MY_API_KEY", "other")
    rotated = compose_config(
        [
            *SECRETS[:1],
            "+cluster.env.HF_TOKEN=new",
            *SECRETS[2:],
            f"run.root_dir={tmp_path / 'runs'}",
        ]
    )
    again = prepare_run_dir(rotated, {}, fresh=False)
    again.release()
    assert again.run_dir.name == prepared.run_dir.name


@pytest.mark.parametrize("value", ["s3cr3t\nline2", "s3cr3t\n", "\ns3cr3t", "s3cr3t\r\nx"])
def test_a_secret_with_a_newline_is_never_echoed(value: str) -> None:
    from launcher.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        compose_config([f"cluster.env.API_TOKEN={value}"])
    message = str(refused.value)
    assert "s3cr3t" not in message and "line2" not in message, message


def test_secret_status_names_only() -> None:
    assert secret_status(["A", "B"], {"A": KEY, "B": ""}) == "secret env: A, B set"
    assert secret_status(["A", "B"], {"A": KEY}) == "secret env: A set; MISSING: B"


def test_error_messages_do_not_quote_a_secret_override() -> None:
    with pytest.raises(ConfigError) as info:
        compose_config([f"+cluster.env.HF_TOKEN={TOKEN}'x"])
    assert TOKEN not in str(info.value) and "+cluster.env.HF_TOKEN=***" in str(info.value)
    with pytest.raises(ConfigError) as info:
        compose_config(["+cluster.env.HF_TOKEN=[s3cr3t,x]"])
    assert "s3cr3t" not in str(info.value) and "got a list" in str(info.value)
    assert mask_secret_overrides("bad: +cluster.env.PLAIN=v", ["+cluster.env.PLAIN=v"]) == (
        "bad: +cluster.env.PLAIN=v"
    )


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.integration
def test_rendered_scripts_take_secrets_from_their_environment(tmp_path: Path) -> None:
    composed = compose_config([*TWO_NODES, *SECRETS])
    assert "HF_TOKEN" not in job_env(composed.config)
    out, bin_dir = tmp_path / "out", tmp_path / "bin"
    bin_dir.mkdir()
    files = render_artifacts(composed, str(out), python=str(bin_dir / "python"), workdir=str(out))
    write_artifacts(files, str(out))
    assert leaks(out) == []
    assert "HF_TOKEN: '***'" in files["config.yaml"]
    for name in ("job.sbatch", "launch.sh"):
        assert "for name in MY_API_KEY HF_TOKEN; do" in files[name]
    stub(bin_dir, "scontrol", 'case "$2" in hostnames) echo n1; echo n2;; esac\n')
    record = 'printf "%s|%s" "$MY_API_KEY" "$HF_TOKEN" >"$STUB_LOG"\n'
    stub(bin_dir, "srun", record)
    stub(bin_dir, "python", record)
    base = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "STUB_LOG": str(tmp_path / "seen"),
    }
    base.pop("HF_TOKEN", None)
    for script in ("job.sbatch", "launch.sh"):
        done = subprocess.run(
            ["bash", str(out / script)], env={**base, "HF_TOKEN": TOKEN}, capture_output=True
        )
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "seen").read_text() == f"{KEY}|{TOKEN}"
        (tmp_path / "seen").unlink()
        # Not in the environment: the script stops, naming it, before anything runs.
        done = subprocess.run(["bash", str(out / script)], env=base, capture_output=True, text=True)
        assert done.returncode == 2 and "secret HF_TOKEN is not set" in done.stderr
        assert not (tmp_path / "seen").exists()


def test_an_export_option_that_would_drop_secrets_is_refused() -> None:
    cfg = compose_config([*TWO_NODES, *SECRETS, 'slurm.extra_sbatch_args=["--export=NONE"]']).config
    from launcher.render.sbatch import render_sbatch

    with pytest.raises(RenderError, match="--export=NONE"):
        render_sbatch(cfg, python="python", run_dir="/r", workdir="/w")


@pytest.mark.integration
def test_submit_hands_secrets_to_sbatch_through_its_environment(tmp_path: Path) -> None:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    stub(
        bin_dir,
        "sbatch",
        'd="$(dirname "$0")"; echo "$@" >>"$d/sbatch.calls"\n'
        'printf "%s|%s\\n" "$MY_API_KEY" "$HF_TOKEN" >>"$d/sbatch.env"\n'
        'echo "$((41 + $(wc -l <"$d/sbatch.calls")))"\n',
    )
    stub(
        bin_dir,
        "scontrol",
        'if [ "$2" = partition ]; then echo "PartitionName=debug Default=YES TotalNodes=2"\n'
        "else exit 1; fi\n",
    )
    path = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    args = ["submit", *TWO_NODES, *SECRETS, "slurm.chain=1"]
    work = tmp_path / "work"
    work.mkdir()
    done = llmtrain(*args, cwd=work, env={**path, "MY_API_KEY": None}, timeout=120)
    assert done.returncode == 2 and "MY_API_KEY not set" in done.stderr
    assert not (work / "runs").exists() and not (bin_dir / "sbatch.calls").exists()

    done = llmtrain(*args, cwd=work, env=path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert KEY not in done.stdout + done.stderr and TOKEN not in done.stdout + done.stderr
    calls = (bin_dir / "sbatch.calls").read_text().splitlines()
    assert all(c.startswith("--parsable --export=ALL ") for c in calls) and len(calls) == 2
    assert (bin_dir / "sbatch.env").read_text() == f"{KEY}|{TOKEN}\n" * 2
    (run_dir,) = (work / "runs").iterdir()
    assert leaks(run_dir) == []
    assert json.loads((run_dir / "slurm.json").read_text())["job_ids"] == ["42", "43"]
