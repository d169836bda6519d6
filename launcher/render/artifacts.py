"""Everything `llmtrain render --out DIR` writes, rendered in memory (nothing is written here:
launcher.launch.render_out writes it, and nothing when any renderer refuses). DIR is also the run
directory the scripts name, so ``sbatch DIR/job.sbatch`` trains from DIR/config.yaml."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from launcher.config.composition.compose import Composed
from launcher.render.run_files import SLURM, Place, run_files


def render_artifacts(
    composed: Composed,
    out_dir: str,
    python: str | None = None,
    workdir: str | None = None,
    plan_doc: dict[str, Any] | None = None,
    run_name: str | None = None,
) -> dict[str, str]:
    """The run directory of `submit` (``launcher.render.run_files``, mode slurm) for OUT_DIR,
    plus megatron_args.txt whatever the backend; plan.json when `plan_doc` is given. `run_name`:
    the run's name, which names the SLURM job (None: OUT_DIR's name)."""
    place = Place(
        run_dir=str(Path(out_dir).expanduser().resolve()),
        python=python or sys.executable,
        workdir=workdir or os.getcwd(),
        run_name=run_name,
    )
    return run_files(composed, plan_doc, SLURM, place, translations=True)
