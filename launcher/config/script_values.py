"""Which configuration values cannot be written into the run's scripts (launch.sh, job.sbatch), and
why: one list of checks that validate reports with every other problem (the ``script-values``
rule of launcher/validate/rules.py) and that the renderers keep as an invariant
(launcher/render/sbatch.py raises RenderError with the same message).

- control characters (newlines, tabs) in a value written into an ``#SBATCH`` line or a script;
- ``cluster.env`` names that are not environment variable names;
- ``slurm.extra_sbatch_args`` entries that are not options, or an ``--export`` that would keep the
  secrets (``run.secret_env``) from the job;
- paths pyxis cannot mount (a ',' or ':' in a folder mounted into ``slurm.container_image``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from launcher.config.schema import LLMTrainConfig
from launcher.config.secrets import public_env, secret_names


@dataclass(frozen=True)
class ScriptProblem:
    keys: tuple[str, ...]
    message: str


def control_problem(key: str, value: str) -> str | None:
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        return f"{key}={value!r}: control characters (newlines, tabs) are not allowed"
    return None


def env_name_problem(name: str) -> str | None:
    if not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
        return f"cluster.env: {name!r} is not a valid environment variable name"
    return None


def extra_sbatch_problem(cfg: LLMTrainConfig, arg: str) -> str | None:
    """Why one entry of slurm.extra_sbatch_args cannot be an #SBATCH line (None: it can)."""
    found = control_problem("slurm.extra_sbatch_args", arg)
    if found:
        return found
    if not arg.startswith("-"):
        return f"slurm.extra_sbatch_args: {arg!r} is not an option (--name=value)"
    option, _, value = arg.partition("=")
    secrets = secret_names(cfg)
    if option == "--export" and secrets and not value.startswith("ALL"):
        return (
            f"slurm.extra_sbatch_args: {arg!r} would keep the secrets ({', '.join(secrets)}) from "
            "the job, which gets them from the environment of sbatch; drop it or use --export=ALL"
        )
    return None


def mount_problem(path: str) -> str | None:
    if "," in path or ":" in path:
        return (
            f"{path!r}: pyxis separates mounts with ',' and ':'; a path holding either cannot be "
            "mounted into slurm.container_image (rename it, or mount it yourself with "
            "slurm.container_mounts)"
        )
    return None


def data_folders(cfg: LLMTrainConfig) -> list[tuple[str, str]]:
    """(key, folder) of the folders holding the data (data.path, blend entries, validation data):
    a dataset may be a Megatron prefix (PREFIX.bin/.idx, no folder of that name) or a prepared
    folder, so its parent folder is the one mounted (rendering does not look at the disk of the
    submit host)."""
    paths = [("data.path", cfg.data.path or "")]
    paths += [("data.blend", str(p)) for p in cfg.data.blend[1::2]]
    paths += [("data.valid_path", cfg.data.valid_path or "")]
    return [(key, str(PurePosixPath(p).parent)) for key, p in paths if p]


def script_problems(cfg: LLMTrainConfig, run_dir: str | None = None) -> list[ScriptProblem]:
    """Every value of `cfg` (and the run directory, when given) that job.sbatch or launch.sh
    cannot hold safely; [] when all can."""
    s = cfg.slurm
    out: list[ScriptProblem] = []

    def control(key: str, value: str | None, keys: tuple[str, ...] = ()) -> None:
        found = control_problem(key, value) if value is not None else None
        if found:
            out.append(ScriptProblem(keys or (key,), found))

    for key in ("job_name", "time", "partition", "account", "qos", "container_image"):
        control(f"slurm.{key}", getattr(s, key))
    control("slurm.container_mounts", s.container_mounts)
    if s.container_image is not None:
        control("slurm.container_python", s.container_python)
    for arg in s.extra_srun_args:
        control("slurm.extra_srun_args", arg)
    control("backend.megatron_path", cfg.backend.megatron_path)
    control("run.root_dir", cfg.run.root_dir)
    control("run.name", cfg.run.name)
    for arg in s.extra_sbatch_args:
        found = extra_sbatch_problem(cfg, arg)
        if found:
            out.append(ScriptProblem(("slurm.extra_sbatch_args",), found))
    for name, value in public_env(cfg).items():
        found = env_name_problem(name) or control_problem(f"cluster.env.{name}", str(value))
        if found:
            out.append(ScriptProblem(("cluster.env",), found))
    if s.container_image is not None:
        wanted = ([("run.root_dir", run_dir)] if run_dir else []) + data_folders(cfg)
        for key, path in wanted:
            found = mount_problem(path) if PurePosixPath(path).is_absolute() else None
            if found:
                out.append(ScriptProblem((key, "slurm.container_image"), found))
    return out
