"""Everything `llmtrain render --out DIR` writes, rendered in memory first (nothing is written
when any renderer refuses). DIR is also the run directory the scripts name, so
``sbatch DIR/job.sbatch`` trains from DIR/config.yaml."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from launcher.config.composition.compose import Composed
from launcher.errors import UserError
from launcher.render.run_files import ARTIFACTS, EXECUTABLE, SLURM, Place, run_files


def render_artifacts(
    composed: Composed,
    out_dir: str,
    python: str | None = None,
    workdir: str | None = None,
    plan_doc: dict[str, Any] | None = None,
) -> dict[str, str]:
    """The run directory of `submit` (``launcher.render.run_files``, mode slurm) for OUT_DIR,
    plus megatron_args.txt whatever the backend; plan.json when `plan_doc` is given."""
    place = Place(
        run_dir=str(Path(out_dir).expanduser().resolve()),
        python=python or sys.executable,
        workdir=workdir or os.getcwd(),
    )
    return run_files(composed, plan_doc, SLURM, place, translations=True)


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
