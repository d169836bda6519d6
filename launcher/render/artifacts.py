"""Everything `llmtrain render --out DIR` writes, rendered in memory first (nothing is written
when any renderer refuses). DIR is also the run directory the scripts name, so
``sbatch DIR/job.sbatch`` trains from DIR/config.yaml."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from launcher.config.compose import Composed
from launcher.data.sources import megatron_data
from launcher.errors import UserError
from launcher.render.ds_config import render_ds_config
from launcher.render.hostfile import static_hostfile
from launcher.render.megatron_args import render_megatron_args
from launcher.render.sbatch import RenderError, render_launch_sh, render_sbatch
from launcher.rundir import (
    CONFIG,
    DS_CONFIG,
    HOSTFILE,
    LAUNCH_SCRIPT,
    MEGATRON_ARGS,
    SBATCH_SCRIPT,
)

EXECUTABLE = (LAUNCH_SCRIPT, SBATCH_SCRIPT)


def render_artifacts(
    composed: Composed, out_dir: str, python: str | None = None, workdir: str | None = None
) -> dict[str, str]:
    cfg = composed.config
    run_dir = str(Path(out_dir).expanduser().resolve())
    python = python or sys.executable
    workdir = workdir or os.getcwd()
    files = {CONFIG: yaml.safe_dump(composed.values, sort_keys=False)}
    try:
        if cfg.backend.name == "deepspeed":
            files[DS_CONFIG] = render_ds_config(cfg)
        files[LAUNCH_SCRIPT] = render_launch_sh(
            cfg, python=python, run_dir=run_dir, workdir=workdir
        )
        files[SBATCH_SCRIPT] = render_sbatch(cfg, python=python, run_dir=run_dir, workdir=workdir)
        files[HOSTFILE] = static_hostfile(cfg)
    except RenderError as exc:
        raise UserError(str(exc)) from None
    # Reads only dataset metadata (index.json, .idx headers) when the data is on this machine.
    data = megatron_data(cfg.data.path, list(cfg.data.blend), cfg.data.valid_path)
    files[MEGATRON_ARGS] = render_megatron_args(cfg, data, run_dir)
    return files


# Every file a render can produce: one that this render does not produce (ds_config.json after
# switching to backend=torch) is removed, so DIR never mixes two configurations.
ARTIFACTS = (CONFIG, DS_CONFIG, LAUNCH_SCRIPT, SBATCH_SCRIPT, HOSTFILE, MEGATRON_ARGS)


def write_artifacts(files: dict[str, str], out_dir: str) -> list[Path]:
    """Write ``files`` into OUT_DIR, all or nothing: each to a temporary name first, then renamed
    into place together; stale artifacts of an earlier render are removed. A folder that cannot
    be used is a UserError naming --out."""
    root = Path(out_dir).expanduser()
    if root.exists() and not root.is_dir():
        raise UserError(
            f"--out={out_dir}: is a file, not a directory; give a new or existing folder"
        )
    staged: list[tuple[Path, Path]] = []
    try:
        root.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            tmp = root / f".{name}.tmp"
            staged.append((tmp, root / name))
            tmp.write_text(text, encoding="utf-8")
            if name in EXECUTABLE:
                tmp.chmod(0o755)
    except OSError as exc:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise UserError(
            f"--out={out_dir}: cannot write there ({exc.strerror or exc}); give a writable folder"
        ) from None
    for tmp, path in staged:
        os.replace(tmp, path)
    for name in ARTIFACTS:
        if name not in files:
            (root / name).unlink(missing_ok=True)
    return [path for _, path in staged]
