"""job.sbatch as SLURM reads it (issue 42 items 8 and 9): the CPUs reach srun and the ranks, every
#SBATCH value reads back as given (tests/sbatch_reader.py models sbatch's own reader), and
`render --out DIR` writes a job that `sbatch DIR/job.sbatch` runs as is."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.render.sbatch import RenderError, render_sbatch
from tests.cli import invoke
from tests.sbatch_reader import output_path, sbatch_option, sbatch_options

TWO_NODES = ["cluster.num_nodes=2", "train.micro_batch_size=4"]
# What a shell would expand or split, what sbatch's reader treats specially (quotes, backslash,
# '#'), and what a filename pattern expands ('%').
AWKWARD = "a b\\c 'q' \"d\" #x $HOME `id` 50%"


def render(overrides: list[str], run_dir: str = "/r/run", workdir: str = "/w") -> str:
    cfg = compose_config([*TWO_NODES, *overrides]).config
    return render_sbatch(cfg, python="python", run_dir=run_dir, workdir=workdir)


def srun_step(script: str) -> str:
    """The training step's srun command, its continuation lines joined."""
    found = re.search(r"^srun .*? &$", script.replace("\\\n", ""), re.M | re.S)
    assert found, script
    return found.group(0)


@pytest.mark.parametrize(
    ("key", "option"),
    [
        ("slurm.job_name", "job-name"),
        ("slurm.partition", "partition"),
        ("slurm.account", "account"),
        ("slurm.qos", "qos"),
        ("slurm.time", "time"),
    ],
)
def test_every_sbatch_value_reads_back_as_given(key: str, option: str) -> None:
    cfg = compose_config(TWO_NODES).config
    section, name = key.split(".")
    setattr(getattr(cfg, section), name, AWKWARD)
    script = render_sbatch(cfg, python="python", run_dir="/r", workdir="/w")
    assert sbatch_option(script, option) == AWKWARD


def test_extra_sbatch_args_and_the_working_directory_read_back_as_given() -> None:
    cfg = compose_config(TWO_NODES).config
    cfg.slurm.extra_sbatch_args = [f"--comment={AWKWARD}", "--exclusive"]
    script = render_sbatch(cfg, python="python", run_dir="/r", workdir=f"/w/{AWKWARD}")
    assert sbatch_option(script, "comment") == AWKWARD
    assert sbatch_option(script, "chdir") == f"/w/{AWKWARD}"
    assert "--exclusive" in sbatch_options(script)


def test_the_logs_are_written_into_the_run_directory_whatever_its_name() -> None:
    # '%' starts a replacement symbol in --output/--error (sbatch(1), "filename pattern"): a run
    # directory holding one must not have it expanded; spaces and quotes must survive sbatch.
    run_dir = "/runs/exp %x 'b' 50%"
    script = render([], run_dir=run_dir)
    assert output_path(sbatch_option(script, "output"), "77") == f"{run_dir}/logs/slurm-77.out"
    assert output_path(sbatch_option(script, "error"), "77") == f"{run_dir}/logs/slurm-77.err"


def test_a_run_directory_slurm_cannot_name_logs_in_is_refused() -> None:
    # Any backslash in an --output pattern turns every %j off (fname.c remove_path_slashes): the
    # job's logs would land in one literal 'slurm-%j.out' file. Refused, naming the key.
    with pytest.raises(RenderError, match=r"run\.root_dir.*backslash"):
        render([], run_dir="/runs/a\\b")


@pytest.mark.parametrize(
    ("overrides", "cpus", "threads"),
    [
        # Unset: one CPU per rank plus one per data loader worker of each rank.
        (["cluster.gpus_per_node=2"], 2, 1),
        (["cluster.gpus_per_node=2", "data.num_workers=3"], 8, 4),
        (["cluster.gpus_per_node=4", "slurm.cpus_per_task=12"], 12, 3),
        (["cluster.gpus_per_node=4", "slurm.cpus_per_task=2"], 2, 1),
        (["recipe=llama3-70b", "cluster=a100-80gb", "slurm.cpus_per_task=96"], 96, 12),
        (["recipe=llama3-70b", "cluster=a100-80gb"], 8, 1),
    ],
)
def test_srun_gives_each_node_the_cpus_the_job_asked(
    overrides: list[str], cpus: int, threads: int
) -> None:
    script = render(overrides)
    assert sbatch_option(script, "cpus-per-task") == str(cpus)
    assert sbatch_option(script, "ntasks-per-node") == "1"  # one torchrun per node
    # Since Slurm 22.05 srun does not take --cpus-per-task from sbatch: it is asked again.
    assert f" --cpus-per-task={cpus} " in srun_step(script)
    assert f"\nexport OMP_NUM_THREADS={threads}\n" in script


def test_launch_sh_tells_the_ranks_the_same_thread_count() -> None:
    from launcher.render.sbatch import render_launch_sh

    cfg = compose_config([*TWO_NODES, "cluster.gpus_per_node=4", "slurm.cpus_per_task=8"]).config
    text = render_launch_sh(cfg, python="python", run_dir="/r", workdir="/w")
    assert "\nexport OMP_NUM_THREADS=2\n" in text


def test_render_out_writes_a_job_sbatch_runs_as_is(tmp_path: Path) -> None:
    # sbatch opens --output before the script runs, and SLURM creates no folder for it.
    path = os.environ["PATH"]
    done = invoke(
        "render", *TWO_NODES, "run.name=exp7", "--out", "job", cwd=tmp_path, env={"PATH": path}
    )
    assert done.returncode == 0, done.stderr
    out = tmp_path / "job"
    script = (out / "job.sbatch").read_text()
    assert (out / "logs").is_dir()
    assert Path(output_path(sbatch_option(script, "output"), "5")).parent == out / "logs"
    # Named after the run, as `submit` names it, not after the folder it was rendered into.
    assert sbatch_option(script, "job-name") == "exp7"

    again = invoke("render", *TWO_NODES, "--out", "job", cwd=tmp_path, env={"PATH": path})
    assert again.returncode == 0, again.stderr
    dry = invoke("submit", *TWO_NODES, "--dry-run", "--json", cwd=tmp_path, env={"PATH": path})
    run_name = Path(json.loads(dry.stdout)["run_dir"]).name
    assert re.fullmatch(r"tiny-[0-9a-f]{8}", run_name)  # <recipe>-<hash of the config>
    assert sbatch_option((out / "job.sbatch").read_text(), "job-name") == run_name
