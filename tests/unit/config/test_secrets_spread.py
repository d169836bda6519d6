"""A declared secret's value never reaches a file, a job name, a screen or the compose cache, also
when `${oc.env:NAME}` pulls it into another key (issue 19, item 5); the compose cache is private
(0600 files in a 0700 folder); a file given as a recipe or --config is never quoted (item 10)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.errors import ConfigError
from tests.cli import invoke

pytestmark = pytest.mark.unit

KEY = "s3cr3t-VALUE-123"
PASSWD_LINE = "root:x:0:0:root-of-this-test:/root:/bin/bash"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("LLMTRAIN_CACHE", raising=False)  # it would win
    monkeypatch.delenv("LLMTRAIN_NO_CACHE", raising=False)
    monkeypatch.setenv("MY_API_KEY", KEY)
    return cache


def leaks(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]


SPREAD = [
    ("slurm.job_name", "slurm.job_name=${oc.env:MY_API_KEY}"),
    ("run.name", "run.name=exp-${oc.env:MY_API_KEY}"),
    ("cluster.env.FOO", "+cluster.env.FOO=${oc.env:MY_API_KEY}"),
    ("data.blend[1]", "data.blend=[1.0,'${oc.env:MY_API_KEY}']"),
]


@pytest.mark.parametrize(("key", "pulled"), SPREAD)
def test_a_secret_pulled_into_another_key_is_refused_without_its_value(
    private_cache: Path, key: str, pulled: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        compose_config(["run.secret_env=[MY_API_KEY]", pulled])
    message = str(refused.value)
    assert f"{key}: holds the value of the secret MY_API_KEY" in message
    assert KEY not in message
    assert leaks(private_cache) == []


@pytest.mark.parametrize("command", [["show"], ["render", "--out", "out"], ["submit", "--dry-run"]])
def test_the_job_name_reproduction_leaks_nowhere(
    tmp_path: Path, private_cache: Path, command: list[str]
) -> None:
    # The reproduction: the value reached #SBATCH --job-name, config.yaml, `show` and the cache.
    done = invoke(
        *command, "run.secret_env=[MY_API_KEY]", "slurm.job_name=${oc.env:MY_API_KEY}", cwd=tmp_path
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "slurm.job_name: holds the value of the secret MY_API_KEY" in done.stderr + done.stdout
    assert KEY not in done.stdout + done.stderr
    assert leaks(tmp_path) == []  # the working folder (render --out) and the cache under it


def test_an_error_about_a_value_from_the_environment_does_not_quote_it() -> None:
    with pytest.raises(ConfigError) as refused:
        compose_config(["run.secret_env=[MY_API_KEY]", "train.steps=${oc.env:MY_API_KEY}"])
    assert "train.steps" in str(refused.value) and KEY not in str(refused.value)


def test_the_secret_in_its_own_place_is_still_fine() -> None:
    composed = compose_config(
        ["run.secret_env=[MY_API_KEY]", "+cluster.env.MY_API_KEY=${oc.env:MY_API_KEY}"]
    )
    assert composed.config.cluster.env["MY_API_KEY"] == KEY
    assert KEY not in str(composed.values)


def test_the_compose_cache_is_private(private_cache: Path) -> None:
    folder = private_cache / "llmtrain" / "compose"
    folder.mkdir(parents=True, mode=0o755)
    folder.chmod(0o755)  # as an older llmtrain (or a umask of 022) left it
    compose_config(["train.steps=7"])
    (entry,) = folder.glob("*.json")
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700


def test_a_cache_folder_that_is_a_link_is_not_used(tmp_path: Path, private_cache: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (private_cache / "llmtrain").mkdir(parents=True)
    (private_cache / "llmtrain" / "compose").symlink_to(elsewhere)
    compose_config(["train.steps=8"])
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("how", ["recipe", "recipe.yaml", "--config"])
def test_a_file_that_is_not_a_config_is_never_quoted(tmp_path: Path, how: str) -> None:
    passwd = tmp_path / ("passwd.yaml" if how == "recipe.yaml" else "passwd")
    passwd.write_text(f"{PASSWD_LINE}\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n")
    args = ["--config", str(passwd)] if how == "--config" else [f"recipe={passwd}"]
    done = invoke("show", *args, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "root" not in done.stderr.replace(str(tmp_path), "") and "Traceback" not in done.stderr
    expected = "*.yaml or *.yml" if how == "recipe" else "must hold keys and values"
    assert expected in done.stderr


def test_recipe_etc_passwd_is_refused_without_reading_it(tmp_path: Path) -> None:
    done = invoke("validate", "recipe=/etc/passwd", cwd=tmp_path)
    assert done.returncode == 2
    assert "root:" not in done.stdout + done.stderr and "*.yaml or *.yml" in done.stdout
