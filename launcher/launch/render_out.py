"""`llmtrain render --out DIR` on disk: the files ``launcher.render.artifacts`` rendered in memory,
written all or nothing, and the folder the job's own logs go to, so that ``sbatch DIR/job.sbatch``
runs as is: sbatch opens job.sbatch's ``--output``/``--error`` (DIR/logs/slurm-%j.out) before
the script runs, and SLURM creates no folder for them (a missing one fails the job at once)."""

from __future__ import annotations

import os
from pathlib import Path

from launcher.errors import UserError
from launcher.render.run_files import ARTIFACTS, EXECUTABLE
from launcher.rundir import RunDir


def write_artifacts(files: dict[str, str], out_dir: str) -> list[Path]:
    """Write ``files`` into OUT_DIR, all or nothing: each to a temporary name first, then renamed
    into place together; stale artifacts of an earlier render are removed; OUT_DIR/logs is made.
    A folder that cannot be used is a UserError naming --out."""
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
        RunDir(root).logs.mkdir(exist_ok=True)
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
