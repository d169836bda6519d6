"""Render and submit without a cluster: quoting proven by running the rendered scripts against
stub SLURM commands, and submit's preflight errors with fake or missing SLURM clients."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.launch.render_out import write_artifacts
from launcher.render.artifacts import render_artifacts
from launcher.render.sbatch import RenderError, render_sbatch
from tests.cli import invoke
from tests.sbatch_reader import sbatch_option

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.

EVIL = "x; touch PWNED $(touch PWNED2) `touch PWNED3` 'q\" \\ ~"
TWO_NODES = ["cluster.num_nodes=2", "train.micro_batch_size=4"]


def override(key: str, value: str) -> str:
    """key='value' for Hydra, escaping what its quoted-string grammar needs."""
    return f"{key}='" + value.replace("'", "\\'") + "'"


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def no_pwned(*folders: Path) -> None:
    for folder in folders:
        assert not [p for p in folder.rglob("PWNED*")], f"something ran in {folder}"


@pytest.mark.integration
def test_user_values_stay_strings_when_the_job_script_runs(tmp_path: Path) -> None:
    composed = compose_config([*TWO_NODES, override("slurm.job_name", EVIL)])
    assert composed.config.slurm.job_name == EVIL
    composed.config.cluster.env = {"EVIL_VAR": EVIL}
    assert composed.config.cluster.env["EVIL_VAR"] == EVIL
    bin_dir, work = tmp_path / "bin", tmp_path / "work $(touch PWNED_W)"
    bin_dir.mkdir()
    work.mkdir()
    out = tmp_path / "run $(touch PWNED_DIR) 'x'"
    files = render_artifacts(composed, str(out), python=str(bin_dir / "python"), workdir=str(work))
    write_artifacts(files, str(out))
    for script in ("job.sbatch", "launch.sh"):
        assert subprocess.run(["bash", "-n", str(out / script)]).returncode == 0
    # sbatch reads #SBATCH lines with its own quoting (not a shell's): the name comes back whole.
    assert sbatch_option(files["job.sbatch"], "job-name") == EVIL

    # Run the job script against stub scontrol/srun: they record what they were given.
    stub(
        bin_dir,
        "scontrol",
        'case "$1 $2" in\n'
        '  "show hostnames") echo n1; echo n2;;\n'
        '  "show node") echo "NodeName=$3 Arch=x NodeAddr=10.1.2.3 NodeHostName=$3";;\n'
        "esac\n",
    )
    stub(
        bin_dir,
        "srun",
        'printf "%s\\n" "$@" >"$STUB_LOG"; printf "%s" "$EVIL_VAR" >"$STUB_LOG.env"\n',
    )
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "123",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "STUB_LOG": str(tmp_path / "srun.args"),
    }
    done = subprocess.run(
        ["bash", str(out / "job.sbatch")], cwd=work, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "rendezvous 10.1.2.3:" in done.stdout
    args = (tmp_path / "srun.args").read_text().splitlines()
    assert args[-1] == str(out.resolve())
    assert "--rdzv-endpoint=10.1.2.3:" + str(20000 + 123 * 7 % 20000) in args
    assert "--rdzv-id=123" in args and "--nnodes=2" in args
    assert (tmp_path / "srun.args.env").read_text() == EVIL
    assert (out / "hostfile").read_text() == "n1 slots=1\nn2 slots=1\n"

    # launch.sh, with a stub python that records its arguments and environment.
    stub(
        bin_dir,
        "python",
        'printf "%s\\n" "$@" >"$STUB_LOG"; printf "%s" "$EVIL_VAR" >"$STUB_LOG.env"\n',
    )
    done = subprocess.run(["bash", str(out / "launch.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    args = (tmp_path / "srun.args").read_text().splitlines()
    assert args[-1] == str(out.resolve()) and "--rdzv-endpoint=127.0.0.1:29500" in args
    assert (tmp_path / "srun.args.env").read_text() == EVIL
    no_pwned(tmp_path, Path.cwd())


def test_a_newline_in_an_sbatch_value_is_refused() -> None:
    cfg = compose_config(TWO_NODES).config
    cfg.slurm.job_name = "a\nrm -rf ~"
    with pytest.raises(RenderError, match=r"slurm\.job_name"):
        render_sbatch(cfg, python="python", run_dir="/r", workdir="/w")
    cfg.slurm.job_name = "ok"
    cfg.cluster.env = {"BAD NAME": "1"}
    with pytest.raises(RenderError, match="BAD NAME"):
        render_sbatch(cfg, python="python", run_dir="/r", workdir="/w")


def test_render_writes_every_artifact(tmp_path: Path) -> None:
    done = invoke(
        "render",
        *TWO_NODES,
        "backend=deepspeed",
        "--out",
        "out",
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"]},
    )
    assert done.returncode == 0, done.stderr
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert names == {
        "config.yaml",
        "plan.json",
        "ds_config.json",
        "launch.sh",
        "job.sbatch",
        "hostfile",
        "megatron_args.txt",
        "logs",  # the folder job.sbatch's --output names: sbatch does not make it
    }


def test_render_refuses_an_invalid_config_and_writes_nothing(tmp_path: Path) -> None:
    done = invoke(
        "render",
        "cluster.num_nodes=2",
        "--out",
        "out",
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"]},
    )
    assert done.returncode == 2 and "batch" in done.stdout + done.stderr
    assert not (tmp_path / "out").exists()


def test_render_again_replaces_the_earlier_files(tmp_path: Path) -> None:
    # deepspeed first (ds_config.json), then torch: the stale ds_config.json must go, so the folder
    # never mixes two configurations; no temporary file stays behind.
    path = os.environ["PATH"]
    first = invoke(
        "render", *TWO_NODES, "backend=deepspeed", "--out", "out", cwd=tmp_path, env={"PATH": path}
    )
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "out" / "ds_config.json").is_file()
    again = invoke(
        "render", *TWO_NODES, "backend=torch", "--out", "out", cwd=tmp_path, env={"PATH": path}
    )
    assert again.returncode == 0, again.stderr
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert names == {
        "config.yaml",
        "plan.json",
        "launch.sh",
        "job.sbatch",
        "hostfile",
        "megatron_args.txt",
        "logs",  # the folder job.sbatch's --output names: sbatch does not make it
    }
    assert "name: torch" in (tmp_path / "out" / "config.yaml").read_text()


@pytest.mark.parametrize("out", ["afile", "afile/sub"])
def test_render_to_an_unusable_folder_is_a_clear_error(tmp_path: Path, out: str) -> None:
    (tmp_path / "afile").write_text("keep me")
    done = invoke("render", "--out", out, cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 2, done.stderr
    assert f"--out={out}" in done.stderr and "Traceback" not in done.stderr
    assert (tmp_path / "afile").read_text() == "keep me"


def test_submit_without_sbatch_says_so(tmp_path: Path) -> None:
    done = invoke("submit", *TWO_NODES, cwd=tmp_path, env={"PATH": str(tmp_path / "empty")})
    assert done.returncode == 2
    assert "sbatch not found on PATH" in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def fake_slurm(tmp_path: Path) -> str:
    """sbatch/scontrol stand-ins: one partition 'debug' (default) with 2 nodes."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    stub(
        bin_dir,
        "sbatch",
        'calls="$(dirname "$0")/sbatch.calls"; echo "$@" >>"$calls"\n'
        'echo "$((41 + $(wc -l <"$calls")))"\n',
    )
    stub(
        bin_dir,
        "scontrol",
        'if [ "$2" = partition ]; then\n'
        '  echo "PartitionName=debug Default=YES TotalCPUs=4 TotalNodes=2 State=UP"\n'
        '  echo "PartitionName=gpu Default=NO TotalCPUs=4 TotalNodes=1 State=UP"\n'
        "else exit 1; fi\n",
    )
    return f"{bin_dir}:{os.environ['PATH']}"


@pytest.mark.integration
def test_submit_unknown_partition(tmp_path: Path, fake_slurm: str) -> None:
    done = invoke(
        "submit", *TWO_NODES, "slurm.partition=debgu", cwd=tmp_path, env={"PATH": fake_slurm}
    )
    assert done.returncode == 2
    assert "slurm.partition=debgu: no such partition (did you mean 'debug'?)" in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.integration
def test_submit_more_nodes_than_the_partition_has(tmp_path: Path, fake_slurm: str) -> None:
    done = invoke(
        "submit", *TWO_NODES, "slurm.partition=gpu", cwd=tmp_path, env={"PATH": fake_slurm}
    )
    assert done.returncode == 2
    assert "cluster.num_nodes=2: partition gpu has 1 node(s)" in done.stderr


@pytest.mark.integration
def test_submit_records_job_ids_and_chains(tmp_path: Path, fake_slurm: str) -> None:
    done = invoke("submit", *TWO_NODES, "slurm.chain=2", cwd=tmp_path, env={"PATH": fake_slurm})
    assert done.returncode == 0, done.stderr
    assert "submitted job 42 43 44" in done.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "slurm.json").read_text())["job_ids"] == ["42", "43", "44"]
    calls = (tmp_path / "fakebin" / "sbatch.calls").read_text().splitlines()
    assert calls[0].startswith("--parsable ") and "--dependency=afterany:42" in calls[1]
    assert "--dependency=afterany:43" in calls[2]
    for name in ("config.yaml", "plan.json", "job.sbatch", "launch.sh"):
        assert (run_dir / name).is_file()


@pytest.mark.integration
def test_submit_json_and_errors_as_json(tmp_path: Path, fake_slurm: str) -> None:
    done = invoke("submit", *TWO_NODES, "--json", cwd=tmp_path, env={"PATH": fake_slurm})
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["job_ids"] == ["42"] and Path(doc["run_dir"]).is_dir()
    # A user error with --json: a JSON document on stdout, exit 2.
    bad = invoke(
        "submit",
        *TWO_NODES,
        "slurm.partition=debgu",
        "--json",
        cwd=tmp_path,
        env={"PATH": fake_slurm},
    )
    assert bad.returncode == 2
    error = json.loads(bad.stdout)
    assert "no such partition" in error["error"] and error["exit_code"] == 2


def test_submit_dry_run_calls_no_slurm_command(tmp_path: Path) -> None:
    # No sbatch on PATH at all: the dry run still answers, and writes nothing.
    done = invoke(
        "submit", "--dry-run", "--json", *TWO_NODES, cwd=tmp_path, env={"PATH": str(tmp_path / "e")}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["valid"] and doc["refusals"]["submit"] == [] and "#SBATCH" in doc["script"]
    assert list(tmp_path.iterdir()) == []


def test_render_json_lists_the_files(tmp_path: Path) -> None:
    path = os.environ["PATH"]
    done = invoke(
        "render", "--out", str(tmp_path / "r"), "--json", cwd=tmp_path, env={"PATH": path}
    )
    assert done.returncode == 0, done.stderr
    files = json.loads(done.stdout)["files"]
    assert any(f.endswith("launch.sh") for f in files)
    bad = invoke(
        "render",
        "parallel.tp=3",
        "--out",
        str(tmp_path / "s"),
        "--json",
        cwd=tmp_path,
        env={"PATH": path},
    )
    assert bad.returncode == 2 and json.loads(bad.stdout)["valid"] is False


@pytest.mark.parametrize("record", ["{not json", "[]", '{"job_ids": "42"}', '{"job_ids": [{}]}'])
@pytest.mark.parametrize("command", ["status", "logs", "cancel"])
def test_a_corrupt_slurm_record_is_a_clear_error(
    tmp_path: Path, fake_slurm: str, record: str, command: str
) -> None:
    run_dir = tmp_path / "runs" / "damaged"
    run_dir.mkdir(parents=True)
    (run_dir / "slurm.json").write_text(record)
    done = invoke(command, str(run_dir), cwd=tmp_path, env={"PATH": fake_slurm})
    assert done.returncode == 2, done.stderr
    assert "slurm.json: not a readable SLURM record" in done.stderr
    assert "Traceback" not in done.stderr


def test_container_jobs_run_the_images_python_with_run_dir_and_data_mounted() -> None:
    composed = compose_config(
        [
            *TWO_NODES,
            "slurm.container_image='nvcr.io#nvidia/pytorch:24.05-py3'",
            "slurm.container_mounts=/scratch:/scratch",
            "data.path=/datasets/web/train_text_document",  # a Megatron prefix
        ]
    )
    script = render_sbatch(
        composed.config, python="/venv/bin/python", run_dir="/runs/r1", workdir="/home/u/p"
    )
    assert "--container-mounts=/scratch:/scratch,/runs/r1:/runs/r1,/home/u/p:/home/u/p," in script
    # The folder holding the prefix's .bin/.idx is mounted (the prefix itself is no folder).
    assert "/datasets/web:/datasets/web" in script and "train_text_document:" not in script
    assert "--container-workdir=/home/u/p" in script
    # The submit host's venv does not exist inside the image.
    assert "/venv/bin/python" not in script and "python3 -m torch.distributed.run" in script
    # A run directory under a user's mount is not mounted twice.
    again = render_sbatch(
        composed.config, python="p", run_dir="/scratch/runs/r1", workdir="/scratch/p"
    )
    assert "/scratch/runs/r1:" not in again and "/scratch/p:" not in again
    with pytest.raises(RenderError, match="pyxis separates mounts"):
        render_sbatch(composed.config, python="p", run_dir="/runs/a,b", workdir="/w")
    # A blend's Megatron prefixes: their folders are mounted.
    blend = compose_config(
        [*TWO_NODES, "slurm.container_image=img", "data.blend=[1,/mnt/a/web_text_document,1,/b/c]"]
    )
    script = render_sbatch(blend.config, python="p", run_dir="/runs/r1", workdir="/w")
    assert "/mnt/a:/mnt/a" in script and "/b:/b" in script
