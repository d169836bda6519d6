"""What a run directory says about how it was started and how it went, for `runs`, `status`,
`diff` and `plot` (no torch import):

- command.json: the `llmtrain run` command that started (or last resumed) the run: what was
  typed (``typed``: options and overrides, `--config FILE` as given), the overrides it stands for
  (``overrides``: a config file's keys expanded), the working directory (a relative
  ``run.root_dir`` is relative to it) and whether it was ``--fresh``. Secret values never reach
  it (a secret-looking ``cluster.env.NAME=...`` override, or any override holding a declared
  secret's value, is written with the value REDACTED).
- config.yaml's values and metrics.jsonl's history, read back bounded, never through a
  symbolic link and never blocking (a FIFO planted in a run directory is no regular file).
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from launcher import bounded_read, fsio, runfiles
from launcher.rundir import RunDir

_CONFIG_BYTES = 1 << 20
# metrics.jsonl is read from its end: about 40,000 steps of history (~250 bytes a line) at most.
_HISTORY_BYTES = 10 << 20
REDACTED = "REDACTED"


def command_path(run_dir: Path) -> Path:
    return RunDir(Path(run_dir)).command


def public_overrides(
    overrides: list[str], values: dict[str, Any], environ: Mapping[str, str]
) -> list[str]:
    """`overrides` with every secret's value replaced by REDACTED (``launcher.config.secrets``:
    secret-looking ``cluster.env`` names and ``run.secret_env``)."""
    from launcher.config.secrets import declared_values, is_secret_name

    secrets = [v for v in declared_values(values, environ).values() if v]
    out = []
    for text in overrides:
        key, sep, value = text.partition("=")
        parts = key.lstrip("+~").split(".")
        secret_key = sep and parts[:2] == ["cluster", "env"] and len(parts) == 3
        if secret_key and (is_secret_name(parts[2]) or value in secrets):
            text = f"{key}={REDACTED}"
        for secret in secrets:
            text = text.replace(secret, REDACTED)
        out.append(text)
    return out


def record_command(
    run_dir: Path,
    *,
    typed: list[str],
    overrides: list[str],
    values: dict[str, Any],
    fresh: bool,
    detach: bool,
) -> None:
    """Write command.json (atomically; the caller holds the run directory's lock)."""
    environ = os.environ
    document = {
        "command": "run",
        "typed": public_overrides(typed, values, environ),
        "overrides": public_overrides(overrides, values, environ),
        "fresh": fresh,
        "detach": detach,
        "cwd": os.getcwd(),
        "time": time.time(),
    }
    run = RunDir(Path(run_dir))
    fsio.write_json_atomic(command_path(run.root), document, root=run.root)


def _strings(value: Any) -> list[str] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return [v[:4096] for v in value[:1000]]


def read_command(run_dir: Path) -> dict[str, Any] | None:
    """command.json checked field by field (None when absent, unreadable or not llmtrain's)."""
    try:  # the bounded reader: a link, a FIFO or a folder in its place is refused
        document = runfiles.read_json_object(command_path(run_dir), max_bytes=1 << 20)
    except (OSError, ValueError):
        return None
    typed, overrides = _strings(document.get("typed")), _strings(document.get("overrides"))
    cwd = document.get("cwd")
    if typed is None or overrides is None or not isinstance(cwd, str):
        return None
    when = document.get("time")
    return {
        # the command word: `run` (what llmtrain records) or `submit` (a refused resume's own)
        "command": "submit" if document.get("command") == "submit" else "run",
        "typed": typed,
        "overrides": overrides,
        "fresh": document.get("fresh") is True,
        "detach": document.get("detach") is True,
        "cwd": cwd,
        "time": when if isinstance(when, int | float) and not isinstance(when, bool) else None,
    }


def _read_regular(path: Path, max_bytes: int, tail: bool = False) -> bytes | None:
    """At most `max_bytes` of a regular file (its end with `tail`), through the one bounded
    reader (``launcher.bounded_read``: no link, no FIFO, no device); None when refused."""
    if not tail:
        try:
            return bounded_read.read_regular(path, max_bytes)
        except (OSError, ValueError):  # FileRefused is a ValueError
            return None
    try:
        fd = bounded_read.open_regular(path)
    except (OSError, ValueError):
        return None
    with os.fdopen(fd, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - max_bytes))
        return f.read(max_bytes)


def config_values(run_dir: Path) -> dict[str, Any] | None:
    """config.yaml's values (a mapping), or None when missing, too large or not YAML keys."""
    import yaml

    data = _read_regular(RunDir(Path(run_dir)).config, _CONFIG_BYTES)
    if data is None:
        return None
    try:
        values = yaml.safe_load(data)
    except (yaml.YAMLError, ValueError, RecursionError):
        return None
    return values if isinstance(values, dict) else None


HISTORY_KEYS = ("step", "loss", "val_loss", "lr", "tokens_per_s", "grad_norm")


def metric_history(run_dir: Path, max_bytes: int = _HISTORY_BYTES) -> list[dict[str, float]]:
    """The numbers of metrics.jsonl's steps (``HISTORY_KEYS``; null and non-numbers left out),
    in file order, from at most its last `max_bytes`. A resumed run's steps after a restart
    replace those it had logged before (the last record of a step wins)."""
    data = _read_regular(RunDir(Path(run_dir)).metrics, max_bytes, tail=True)
    if not data:
        return []
    lines = data.split(b"\n")
    if len(data) >= max_bytes:
        lines = lines[1:]  # the first line may be cut
    by_step: dict[int, dict[str, float]] = {}
    for line in lines:
        if not line.strip():
            continue
        with contextlib.suppress(ValueError):
            record = runfiles.loads(line, max_bytes=65536, max_depth=4)
            if not isinstance(record, dict):
                continue
            numbers = {
                key: float(record[key])
                for key in HISTORY_KEYS
                if isinstance(record.get(key), int | float)
                and not isinstance(record[key], bool)
                and math.isfinite(record[key])
            }
            if "step" in numbers:
                by_step[int(numbers["step"])] = numbers
    return [by_step[step] for step in sorted(by_step)]


def plan_layout(run_dir: Path) -> dict[str, Any] | None:
    """plan.json's ``layout`` (the degrees ``launcher.config.layout.derive_layout`` derived when
    the run was planned), or None."""
    data = _read_regular(RunDir(Path(run_dir)).plan, 16 << 20)
    if data is None:
        return None
    try:
        document = runfiles.loads(data, max_bytes=16 << 20)
    except ValueError:
        return None
    layout = document.get("layout") if isinstance(document, dict) else None
    return layout if isinstance(layout, dict) else None


def layout_text(layout: dict[str, Any] | None, values: dict[str, Any] | None) -> str | None:
    """``dp2 zero3``, ``tp2 pp2 dp2``: the plan's parallel degrees above 1 (dp always), and the
    ZeRO stage of config.yaml when there is one; None without a plan."""
    if not layout:
        return None

    def degree(key: str) -> int:
        value = layout.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 1

    parts = [f"{k}{degree(k)}" for k in ("tp", "pp", "vpp", "cp") if degree(k) > 1]
    parts.append(f"dp{degree('dp')}")
    parts += [f"ep{degree('ep')}"] if degree("ep") > 1 else []
    zero = (values or {}).get("zero")
    stage = zero.get("stage") if isinstance(zero, dict) else None
    if isinstance(stage, int) and not isinstance(stage, bool) and stage > 0:
        parts.append(f"zero{stage}")
    return " ".join(parts)


def overrides_text(record: dict[str, Any] | None) -> str:
    """What the run's command gave beyond its recipe (its typed overrides and options, `recipe=`
    left out), ``-`` when it gave nothing, ``?`` when the run recorded no command."""
    if record is None:
        return "?"
    typed = [t for t in record["typed"] if not t.startswith(("recipe=", "--force"))]
    return " ".join(typed) if typed else "-"


def resume_command(record: dict[str, Any] | None, folder: Path, cwd: str | None = None) -> str:
    """The command that resumes the run in `folder` (the one builder of it: `status`, `runs
    --json`, a stopped `run` and a refused resume all print this): its recorded command without
    --fresh (a fresh run's folder is named by the command's run.name), preceded by ``cd DIR &&``
    when it was started elsewhere than `cwd`. Without a record: the advice to run the same
    command."""
    if record is None:
        return "the same `llmtrain run` command (this run recorded no command)"
    word = record.get("command", "run")
    args = ["llmtrain", word, *(["--detach"] if record["detach"] else []), *record["typed"]]
    if record["fresh"]:
        args.append(f"run.name={folder.name}")
    text = shlex.join(args)
    if cwd is not None and record["cwd"] != cwd:
        text = f"cd {shlex.quote(record['cwd'])} && {text}"
    return text
