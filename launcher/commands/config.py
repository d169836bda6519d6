"""`show`, `validate`, `render`, `recipes`, and the verdict `run --dry-run` and
`submit --dry-run` print: the configuration, checked and rendered, nothing started."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from launcher.commands.common import (
    ConfigFile,
    JsonFlag,
    Overrides,
    compose_valid,
    out,
    print_json,
    with_config,
)
from launcher.errors import UserError

if TYPE_CHECKING:
    from launcher.verdict import Verdict


def show(
    overrides: Overrides = None,
    config: ConfigFile = None,
    sources: Annotated[
        bool, typer.Option("--sources", help="Show where each value came from.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Print the resolved configuration."""
    overrides = with_config(config, overrides)
    from launcher.config.composition.compose import compose_config
    from launcher.views.config import show_config

    composed = compose_config(overrides or [])
    source_map = None
    if sources:
        from launcher.config.composition.provenance import value_sources

        source_map = value_sources(composed)
    if as_json:
        print_json(
            {"config": composed.values, "sources": source_map} if sources else composed.values
        )
    else:
        show_config(out, composed, source_map)


def validate(
    overrides: Overrides = None, config: ConfigFile = None, as_json: JsonFlag = False
) -> None:
    """Check the config, the layout rules and the backend's capabilities; every problem at once;
    exit 2 on errors. Notes say what `run`/`submit` would still refuse."""
    overrides = with_config(config, overrides)
    verdict("validate", overrides or [], force=False, as_json=as_json)


def verdict(command: str, overrides: list[str], *, force: bool, as_json: bool) -> None:
    """validate, run --dry-run and submit --dry-run: one verdict, one exit code rule."""
    from launcher.verdict import assess
    from launcher.views.config import show_verdict, verdict_document

    found = assess(overrides, force=force)
    document = verdict_document(found, command)
    if command != "validate" and found.valid and found.composed is not None:
        _dry_run_files(found, command, document, as_json=as_json)
    if as_json:
        print_json(document)
    else:
        show_verdict(out, found, command)
    code = found.exit_code(command)
    if code:
        raise typer.Exit(code)


def _dry_run_files(
    found: Verdict, command: str, document: dict[str, Any], *, as_json: bool
) -> None:
    """The files `run`/`submit` would write, byte for byte (launcher.render.run_files), into
    `document`; without `as_json`, the plan's headline and the script are printed."""
    from launcher.launch.local import place_of, run_dir_for
    from launcher.plan.document import plan_to_json
    from launcher.render.run_files import LOCAL, SLURM, run_files

    composed = found.composed
    assert composed is not None  # the caller checked
    plan_doc = plan_to_json(found.plan) if found.plan is not None else None
    mode = LOCAL if command == "run" else SLURM
    files: dict[str, str] = {}
    run_dir = None
    with contextlib.suppress(UserError):  # a refusal the verdict already reports
        run_dir = run_dir_for(composed).resolve()
        files = run_files(composed, plan_doc, mode, place_of(composed.config, run_dir))
    script = "launch.sh" if command == "run" else "job.sbatch"
    document["run_dir"] = str(run_dir) if run_dir else None
    document["artifacts"] = sorted(files)
    document["files"] = files
    document["script"] = files.get(script)
    if plan_doc is not None:
        document["plan"] = plan_doc
    if not as_json and found.plan is not None:
        from launcher.views.plan import plan_headline

        out.print(plan_headline(found.plan))
    if not as_json and script in files:
        out.print(Text(f"--- {script} (in {run_dir}, the run directory it would use) ---"))
        out.file.write(files[script])
        out.file.flush()


def recipes(as_json: JsonFlag = False) -> None:
    """List the shipped recipes: parameters, layout, GPUs."""
    from launcher.views.config import recipe_rows, show_recipes

    rows = recipe_rows()
    if as_json:
        print_json(rows)
    else:
        show_recipes(out, rows)


def render(
    overrides: Overrides = None,
    config: ConfigFile = None,
    out_dir: Annotated[
        str, typer.Option("--out", help="Folder to write the artifacts into (created).")
    ] = "render",
    as_json: JsonFlag = False,
) -> None:
    """Write config.yaml, plan.json, launch.sh, job.sbatch, hostfile, megatron_args.txt (and
    ds_config.json for backend=deepspeed) into --out, replacing an earlier render's files."""
    overrides = with_config(config, overrides)
    from launcher.render.artifacts import render_artifacts, write_artifacts

    composed, _ = compose_valid(overrides or [], json_errors=as_json)
    from launcher.plan.document import plan_to_json
    from launcher.plan.planner import make_plan

    files = render_artifacts(composed, out_dir, plan_doc=plan_to_json(make_plan(composed.config)))
    from pathlib import Path

    from launcher.rundir import RunDir

    lock = RunDir(Path(out_dir).expanduser()).lock
    if lock.exists() or lock.is_symlink():  # a run directory: one writer, also for render
        from launcher.launch import runlock

        with runlock.holding(lock.parent):
            written = write_artifacts(files, out_dir)
    else:
        written = write_artifacts(files, out_dir)
    if as_json:
        print_json({"out_dir": out_dir, "files": [str(path) for path in written]})
        return
    for path in written:
        out.print(str(path))
