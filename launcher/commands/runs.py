"""`runs`, `status`, `logs`, `cancel`, `diff` and `plot`: the runs under a run root, one run's
state, logs and stop (through its handle, launcher.launch.handles, local or SLURM alike), and
runs compared."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from launcher.commands.common import (
    ConfigFile,
    JobArg,
    JsonFlag,
    RootOption,
    note,
    out,
    print_json,
    with_config,
    write_flush,
)
from launcher.errors import UserError

if TYPE_CHECKING:
    from launcher.launch.handles import RunHandle


def runs_command(root: RootOption = "runs", as_json: JsonFlag = False) -> None:
    """List the runs under the run root: status, progress, last loss, when they started, and
    what tells them apart (backend, layout, the overrides they were started with)."""
    from launcher.launch.local_runs import list_runs

    infos = list_runs(Path(root))
    if as_json:
        print_json({"root": root, "runs": [i.to_json() for i in infos]})
        return
    if not infos:
        out.print(f"no runs under {root}/ (start one with `llmtrain run`)", markup=False)
        return
    from rich.table import Table

    from launcher.views.runs import runs_rows

    rows = runs_rows(infos)
    table = Table(box=None, pad_edge=False)
    for column in rows[0]:
        table.add_column(
            column,
            justify="right" if column in ("step", "loss") else "left",
            no_wrap=column != "overrides",
        )
    for row in rows:
        table.add_row(*(Text(value) for value in row.values()))
    # Into a pipe or a file: whole rows (for grep), not cut at 80 columns.
    wide = out if out.is_terminal else Console(highlight=False, soft_wrap=False, width=10_000)
    wide.print(table)
    out.print(
        Text(
            f"in {Path(root).resolve()}; llmtrain status|logs|cancel|plot NAME, "
            "llmtrain diff NAME OTHER",
            style="dim",
        )
    )


def handle(target: str, root: str, choose: str = "newest") -> RunHandle:
    """The run `target` names (launcher.launch.handles.open_run); a note on stderr when a name
    that several runs begin with was resolved to one of them."""
    from launcher.launch.handles import open_run

    return open_run(target, Path(root), choose=choose, note=note)


def status(target: JobArg, root: RootOption = "runs", as_json: JsonFlag = False) -> None:
    """Where a run stands: a local run's state, progress, loss so far and the command that
    resumes it, or a submitted job's."""
    run = handle(target, root)
    if as_json:
        print_json(run.status_document())
        return
    for line in run.status_lines():
        out.print(line, highlight=False, markup=False, soft_wrap=True)


def logs(
    target: JobArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job finishes.")
    ] = False,
    root: RootOption = "runs",
    as_json: JsonFlag = False,
) -> None:
    """Print a run's output: a local run's rank-0 log, or a submitted job's stdout and stderr."""
    if as_json and follow:
        raise UserError("--json prints the logs as they are now; drop --follow (or --json)")
    run = handle(target, root)
    if not as_json:
        run.logs(write_flush, follow=follow)
        return
    files = [
        {"path": str(path), "text": data.decode("utf-8", "replace") if data is not None else None}
        for path, data in run.log_texts()
    ]
    print_json({"files": files})


def cancel(target: JobArg, root: RootOption = "runs", as_json: JsonFlag = False) -> None:
    """Stop a run: a local one as Ctrl-C would (it checkpoints, then exits), or cancel its
    submitted jobs; then wait until it stopped."""
    run = handle(target, root, "running")
    lines = run.cancel()
    if as_json:
        print_json({run.units: lines})
        return
    for line in lines:
        out.print(line, highlight=False, markup=False)


RunArg = Annotated[
    str, typer.Argument(help="A run: its name as `llmtrain runs` lists it (or the start of it).")
]


def run_values(name: str, root: str) -> tuple[Path, dict[str, Any]]:
    """A run's folder and its config.yaml's values (exit 2 naming what is missing)."""
    from launcher.launch.local_runs import resolve_run
    from launcher.launch.run_record import config_values

    resolved = resolve_run(name, Path(root))
    if resolved.folder is None:
        raise UserError(f"{name}: no run of that name under {root}/ (`llmtrain runs`)")
    if resolved.note:
        note(resolved.note)
    values = config_values(resolved.folder)
    if values is None:
        raise UserError(f"{resolved.folder / 'config.yaml'}: missing or not YAML keys")
    return resolved.folder, values


def diff(
    target: RunArg,
    other: Annotated[
        list[str] | None,
        typer.Argument(
            help="Another run, or overrides as `llmtrain run` takes them (what that command "
            "would train)."
        ),
    ] = None,
    config: ConfigFile = None,
    root: RootOption = "runs",
    as_json: JsonFlag = False,
) -> None:
    """The configuration keys whose values differ: between two runs, or between a run and what
    `llmtrain run OVERRIDES` would train (and whether that command resumes the run)."""
    from launcher.config.differences import differences, flat_values

    folder, left = run_values(target, root)
    given = list(other or [])
    resumes: bool | None = None
    is_run = (
        len(given) == 1
        and not config
        and "=" not in given[0]
        and not given[0].startswith(("+", "~"))
    )
    if is_run:
        other_folder, right = run_values(given[0], root)
        right_label = other_folder.name
    else:
        right_label, right, resumes = _command_values(folder, given, config)
    rows = differences(flat_values(left), flat_values(right))
    if as_json:
        print_json(
            {
                "a": str(folder),
                "b": right_label,
                "differences": [{"key": k, "a": a, "b": b} for k, a, b in rows],
                "resumes": resumes,
            }
        )
        return
    _show_differences(folder, right_label, rows, resumes)


def _command_values(
    folder: Path, given: list[str], config: str | None
) -> tuple[str, dict[str, Any], bool | None]:
    """What `llmtrain run GIVEN` would train: the command, its values (secrets redacted), and
    whether it resumes the run in `folder` (None when its run directory cannot be named)."""
    import shlex

    from launcher.config.composition.compose import compose_config
    from launcher.config.secrets import redact
    from launcher.launch.local import run_dir_for

    composed = compose_config(with_config(config, given))
    typed = [*(["--config", config] if config else []), *given]
    resumes = None
    with contextlib.suppress(UserError, OSError):
        resumes = run_dir_for(composed).resolve() == folder
    return shlex.join(["llmtrain", "run", *typed]), redact(composed.values), resumes


def _show_differences(
    folder: Path, right_label: str, rows: list[tuple[str, str, str]], resumes: bool | None
) -> None:
    if not rows:
        out.print(f"{folder.name} and {right_label}: the same configuration", markup=False)
    else:
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for column in ("key", folder.name, right_label):
            table.add_column(Text(column), overflow="fold")
        for key, a, b in rows:
            table.add_row(Text(key), Text(a), Text(b))
        out.print(table)
    if resumes is not None:
        out.print(
            Text(
                f"that command resumes {folder.name}"
                if resumes
                else f"that command trains another run, not {folder.name} (its name hashes "
                "what it trains: see docs/training.md)",
                style="dim",
            )
        )


def plot(
    targets: Annotated[
        list[str],
        typer.Argument(help="Runs to draw (names, starts of names or folders); several compare."),
    ],
    out_path: Annotated[
        str, typer.Option("--out", "-o", help="The image to write: .png, .svg or .pdf.")
    ] = "loss.png",
    root: RootOption = "runs",
    as_json: JsonFlag = False,
) -> None:
    """Draw runs' loss, validation loss, learning rate and tokens/s against steps into an image
    (needs matplotlib: pip install 'llmtrain[plot]')."""
    from launcher import fsio
    from launcher.launch.local_runs import resolve_run
    from launcher.launch.run_record import metric_history
    from launcher.views.plot import figure_bytes

    target = Path(out_path).expanduser()
    fmt = target.suffix.lstrip(".").lower()
    if target.is_dir() or target.is_symlink():
        raise UserError(f"--out={out_path}: a folder or a link; give an image file, e.g. loss.png")
    runs = []
    for name in targets:
        resolved = resolve_run(name, Path(root))
        if resolved.folder is None:
            raise UserError(f"{name}: no run of that name under {root}/ (`llmtrain runs`)")
        if resolved.note:
            note(resolved.note)
        history = metric_history(resolved.folder)
        if not history:
            raise UserError(
                f"{resolved.folder.name}: no metrics yet ({resolved.folder}/metrics.jsonl)"
            )
        runs.append((resolved.folder.name, history))
    data = figure_bytes(runs, fmt)
    try:
        fsio.write_atomic(target, data)
    except OSError as exc:
        raise UserError(f"--out={out_path}: cannot write it ({exc.strerror or exc})") from None
    steps = sum(len(h) for _, h in runs)
    if as_json:
        print_json({"out": str(target), "runs": [n for n, _ in runs], "points": steps})
        return
    out.print(f"wrote {target}: {', '.join(n for n, _ in runs)} ({steps} steps)", markup=False)
