"""The `llmtrain` command line: parse, call one function per command, print.

Commands here never import torch or deepspeed (see tests/unit/test_cli_imports.py).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from launcher import __version__
from launcher.errors import UserError

app = typer.Typer(
    name="llmtrain",
    help=(
        "Plan, validate and launch large-language-model pre-training from composable configs.\n\n"
        "Configs are Hydra overrides: key=value, +key=value, ~key, group=option, recipe=NAME."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _complete_override(incomplete: str) -> list[str]:
    import os

    from launcher.cli_hints import complete_override

    # bash hands over its own words (split at '=' too, by COMP_WORDBREAKS) and which one the
    # cursor is in; Typer passes none of the words before it, so they are read here.
    words, cword = os.environ.get("COMP_WORDS"), os.environ.get("COMP_CWORD", "")
    if words is not None and cword.isdigit():
        from click.shell_completion import split_arg_string

        split = split_arg_string(words)
        at = int(cword)
        return complete_override(split[at] if at < len(split) else "", split[1:at])
    return complete_override(incomplete)


def _bash_keeps_a_key_open() -> None:
    """bash appends a space after the one completion it inserts; after `parallel.tp=` that would
    leave `parallel.tp= 8` (two words). Typer's bash script (the one --install-completion writes
    and `_LLMTRAIN_COMPLETE=source_bash` prints) gains `compopt -o nospace` for a single
    completion ending in '='. Left as it is if a Typer release words its script otherwise."""
    from typer import _completion_classes, _completion_shared

    script = _completion_shared.COMPLETION_SCRIPT_BASH
    end = "    return 0\n}"
    if end not in script or "compopt" in script:
        return
    patched = script.replace(
        end,
        "    [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == *= ]] && compopt -o nospace\n" + end,
    )
    _completion_shared._completion_scripts["bash"] = patched
    _completion_classes.BashComplete.source_template = patched


_bash_keeps_a_key_open()


def _complete_run(ctx: typer.Context, incomplete: str) -> list[str]:
    from launcher.cli_hints import complete_run_name

    return complete_run_name(str(ctx.params.get("root") or "runs"), incomplete)


Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Hydra overrides, e.g. recipe=llama3-70b parallel.tp=8 zero.stage=3",
        autocompletion=_complete_override,
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print a JSON document for scripts.")]
ConfigFile = Annotated[
    str | None,
    typer.Option(
        "--config",
        "-c",
        help="Your own YAML config file (keys as `show` prints them); overrides win over it.",
    ),
]


def _with_config(config: str | None, overrides: list[str] | None) -> list[str]:
    """--config FILE as the overrides it stands for, before the command line's (which win)."""
    if not config:
        return list(overrides or [])
    from launcher.config.config_file import expand

    return expand(config, list(overrides or []))


out = Console(highlight=False, soft_wrap=False)
# Errors and notes wrap at the width of a terminal; into a pipe or a file each stays one line,
# whole, for grep and for the tests that read it.
err = Console(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty())


def _print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")


def _tell(console: Console, text: Text) -> None:
    """A message of a long-running command (`run`): its terminal may have closed or its pipe's
    reader gone meanwhile (EIO, EPIPE), which must not turn the run's outcome into a traceback
    or change its exit code."""
    try:
        console.print(text)
    except (OSError, ValueError):
        from launcher.launch.console import silence_stdout

        silence_stdout()


def _version(value: bool) -> None:
    if value:
        out.print(f"llmtrain {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """llmtrain: plan, validate and launch LLM pre-training."""


@app.command()
def show(
    overrides: Overrides = None,
    config: ConfigFile = None,
    sources: Annotated[
        bool, typer.Option("--sources", help="Show where each value came from.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Print the resolved configuration."""
    overrides = _with_config(config, overrides)
    from launcher.config.compose import compose_config
    from launcher.views.config import show_config

    composed = compose_config(overrides or [])
    source_map = None
    if sources:
        from launcher.config.provenance import value_sources

        source_map = value_sources(composed)
    if as_json:
        _print_json(
            {"config": composed.values, "sources": source_map} if sources else composed.values
        )
    else:
        show_config(out, composed, source_map)


@app.command()
def validate(
    overrides: Overrides = None, config: ConfigFile = None, as_json: JsonFlag = False
) -> None:
    """Check the config, the layout rules and the backend's capabilities; every problem at once;
    exit 2 on errors. Notes say what `run`/`submit` would still refuse."""
    overrides = _with_config(config, overrides)
    _verdict("validate", overrides or [], force=False, as_json=as_json)


def _verdict(command: str, overrides: list[str], *, force: bool, as_json: bool) -> None:
    """validate, run --dry-run and submit --dry-run: one verdict, one exit code rule."""
    from launcher.verdict import assess
    from launcher.views.config import show_verdict, verdict_document

    verdict = assess(overrides, force=force)
    document = verdict_document(verdict, command)
    if command != "validate" and verdict.valid and verdict.composed is not None:
        from launcher.launch.local import place_of, run_dir_for
        from launcher.plan.document import plan_to_json
        from launcher.render.run_files import LOCAL, SLURM, run_files

        composed = verdict.composed
        plan_doc = plan_to_json(verdict.plan) if verdict.plan is not None else None
        mode = LOCAL if command == "run" else SLURM
        # The files this command would write, byte for byte (launcher.render.run_files).
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
        if not as_json and verdict.plan is not None:
            from launcher.views.plan import plan_headline

            out.print(plan_headline(verdict.plan))
        if not as_json and script in files:
            out.print(Text(f"--- {script} (in {run_dir}, the run directory it would use) ---"))
            out.file.write(files[script])
            out.file.flush()
    if as_json:
        _print_json(document)
    else:
        show_verdict(out, verdict, command)
    code = verdict.exit_code(command)
    if code:
        raise typer.Exit(code)


AllowConfigChange = Annotated[
    bool,
    typer.Option(
        "--allow-config-change",
        help="Resume a run although this command changes what it trains (model, data, batch, "
        "optimizer, schedule, steps, seed, precision, layout); the change is recorded in the "
        "run's config_history.jsonl. Without it such a resume is refused (exit 2).",
    ),
]
DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Validate, plan, check and render without starting anything or writing files; "
        "same verdict and exit code as validate (plus what this command would refuse).",
    ),
]


@app.command()
def plan(
    overrides: Overrides = None,
    config: ConfigFile = None,
    headroom: Annotated[
        float,
        typer.Option(
            "--headroom",
            "--min-headroom",
            help="Memory kept free, as a fraction of the GPU's capacity.",
        ),
    ] = 0.10,
    search: Annotated[
        bool,
        typer.Option(
            "--search",
            help="Search every valid layout for the fastest that fits (keys given are kept).",
        ),
    ] = False,
    top: Annotated[int, typer.Option(help="With --search: layouts to show.")] = 10,
    max_tp: Annotated[int | None, typer.Option(help="With --search: largest tp.")] = None,
    max_pp: Annotated[int | None, typer.Option(help="With --search: largest pp.")] = None,
    any_backend: Annotated[
        bool,
        typer.Option(
            "--any-backend",
            help="With --search: rank the layouts of every backend, not only the configured one.",
        ),
    ] = False,
    json_schema: Annotated[
        bool,
        typer.Option("--json-schema", help="Print the JSON Schema of the --json document."),
    ] = False,
    measure: Annotated[
        bool,
        typer.Option(
            "--measure",
            help="Train the model shrunk to 1 and 2 layers per pipeline chunk for a few real "
            "steps on this machine and extrapolate step time and memory to the full model.",
        ),
    ] = False,
    detail: Annotated[
        bool,
        typer.Option(
            "--detail",
            help="Also print memory by bucket and stage, the pipeline timeline, collectives, "
            "totals and every assumption.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Predict per-GPU memory, step time, MFU, communication, cost and checkpoint cadence."""
    overrides = _with_config(config, overrides)
    from launcher.config.compose import compose_config

    if measure:
        if search:
            raise UserError("--measure and --search: pick one (measure plans one layout)")
        _plan_measure(list(overrides or []), as_json)
        return

    if json_schema:
        from launcher.views.plan_schema import plan_json_schema

        _print_json(plan_json_schema())
        return

    if not 0 <= headroom < 1:
        raise UserError(f"--headroom={headroom}: must be a fraction in [0, 1), e.g. 0.10")
    composed = compose_config(overrides or [])
    if search:
        from launcher.search.layouts import fixed_keys, search_backends
        from launcher.search.layouts import search as search_layouts
        from launcher.views.search import render_search, search_to_json

        options: dict[str, Any] = {
            "top": top,
            "min_headroom": headroom,
            "max_tp": max_tp,
            "max_pp": max_pp,
            "fixed": fixed_keys(overrides or []) - {"backend", "backend.name"},
        }
        if any_backend:
            from launcher.backends import all_backends

            configs = {composed.config.backend.name: composed.config}  # as given first
            for name in all_backends():
                if name not in configs:
                    configs[name] = compose_config([*(overrides or []), f"backend={name}"]).config
            result = search_backends(configs, **options)
        else:
            result = search_layouts(composed.config, **options)
        if as_json:
            _print_json(search_to_json(result))
        else:
            from launcher.config.provenance import flatten

            render_search(
                result, out, given_values=None if any_backend else flatten(composed.values)
            )
        return

    from launcher.plan.document import plan_to_json
    from launcher.plan.planner import make_plan
    from launcher.validate.rules import check, passes
    from launcher.verdict import substitute_backend
    from launcher.views.config import show_violations
    from launcher.views.plan import render_plan

    violations = check(composed.config)
    substitute = None
    if any(v.is_error for v in violations):
        found = substitute_backend(composed.config, violations, headroom=headroom)
        if found is None:
            if as_json:
                from launcher.views.config import validation_document

                _print_json(validation_document(composed, violations))
            else:
                show_violations(err, composed, violations)
            raise typer.Exit(2)
        substitute, result_plan = found
        violations = [v for v in violations if not v.is_error]
    else:
        result_plan = make_plan(composed.config, headroom=headroom, accept=passes)
    if as_json:
        document = plan_to_json(result_plan)
        document["warnings"] = [v.message for v in violations] + list(composed.notes)
        if substitute is not None:
            document["backend_substituted"] = {
                "requested": substitute.requested,
                "planned": substitute.planned,
                "reasons": list(substitute.reasons),
            }
        _print_json(document)
    else:
        for v in violations:
            err.print(Text(f"warning [{v.rule}] ", style="yellow") + Text(v.message))
        for note in composed.notes:  # what model.from_hf did not carry over
            err.print(Text("note ", style="yellow") + Text(note))
        if substitute is not None:
            err.print(
                Text("note ", style="yellow")
                + Text(
                    f"backend={substitute.requested} does not run this layout "
                    f"({'; '.join(substitute.reasons)}); planned with "
                    f"backend={substitute.planned}, which runs it as it is. validate, run "
                    f"and submit refuse it until backend={substitute.planned} is set."
                )
            )
        if result_plan.profile_note:
            err.print(Text("note ", style="yellow") + Text(result_plan.profile_note))
        render_plan(result_plan, out, detail=detail)


def _plan_measure(overrides: list[str], as_json: bool) -> None:
    from launcher.config.compose import compose_config
    from launcher.launch.measure import measure, table, to_json
    from launcher.validate.rules import check
    from launcher.views.config import show_violations

    composed = compose_config(overrides)
    violations = check(composed.config)
    if any(v.is_error for v in violations):
        show_violations(err, composed, violations)
        raise typer.Exit(2)

    def progress(line: str) -> None:
        err.print(Text(line, style="dim"))

    result = measure(overrides, progress)
    if as_json:
        _print_json(to_json(result))
    else:
        sys.stdout.write(table(result) + "\n")


@app.command()
def run(
    overrides: Overrides = None,
    config: ConfigFile = None,
    force: Annotated[
        bool, typer.Option("--force", help="Launch even if the plan predicts it will not fit.")
    ] = False,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Start over in a new run directory (no resume).")
    ] = False,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            "-d",
            help="Run in the background (its own session, output in the run directory): it "
            "survives the terminal; follow it with `llmtrain logs NAME --follow`.",
        ),
    ] = False,
    detached_child: Annotated[bool, typer.Option("--detached-child", hidden=True)] = False,
    allow_config_change: AllowConfigChange = False,
    dry_run: DryRun = False,
    as_json: JsonFlag = False,
) -> None:
    """Train on this machine under torchrun (default: the tiny recipe on the CPU)."""
    typed = [
        *(["--config", config] if config else []),
        *(["--force"] if force else []),
        *(overrides or []),
    ]
    overrides = _with_config(config, overrides)
    if dry_run:
        _verdict("run", overrides or [], force=force, as_json=as_json)
        return
    if detach and not detached_child:
        _run_detached([*(["--fresh"] if fresh else []), *typed], as_json)
        return
    from launcher.config.compose import compose_config
    from launcher.launch.local import (
        RunFailed,
        RunInterrupted,
        RunPreempted,
        describe,
        launch,
        prepare_run_dir,
    )
    from launcher.launch.preflight import preflight
    from launcher.launch.run_record import read_command, record_command, resume_command
    from launcher.launch.slurm import refuse_live_jobs
    from launcher.plan.document import plan_to_json

    composed = compose_config(overrides or [])
    plan_result = preflight(composed.config, force=force)
    # Holds the run directory's lock (exit 2 naming the holder when another run has it), and
    # refuses a run directory whose SLURM job is queued or running.
    prepared = prepare_run_dir(
        composed,
        plan_to_json(plan_result),
        fresh=fresh,
        guard=refuse_live_jobs,
        allow_config_change=allow_config_change,
    )
    try:
        try:  # command.json: what `status` shows and the command that resumes the run
            record_command(
                prepared.run_dir,
                typed=typed,
                overrides=list(overrides or []),
                values=composed.values,
                fresh=fresh,
                detach=detached_child,
            )
        except OSError as exc:
            _tell(err, Text(f"note: command.json not written ({exc})", style="yellow"))
        if prepared.lock is not None and prepared.lock.note:
            _tell(err, Text(f"note: {prepared.lock.note}", style="yellow"))
        if detached_child:  # from here on, output goes to logs/launcher.log
            from launcher.launch.detach import hand_over

            hand_over(prepared.run_dir)
        _tell(err, Text(describe(prepared), style="dim"))
        # With --json, rank 0's progress goes to stderr and stdout gets one document at the end;
        # a detached run writes no progress (its rank-0 log has it).
        launch(prepared, progress_to_stderr=as_json, screen=not detached_child)
    except (RunFailed, RunPreempted, RunInterrupted) as exc:
        again = resume_command(read_command(prepared.run_dir), prepared.run_dir)
        if as_json:
            _print_json(
                {
                    "run_dir": str(prepared.run_dir),
                    "error": str(exc),
                    "exit_code": exc.exit_code,
                    "resume_command": again,
                }
            )
        else:
            label = "error: " if isinstance(exc, RunFailed) else ""
            _tell(err, Text(label, style="bold red") + Text(str(exc)))
            _tell(err, Text(f"resume: {again}", style="dim"))
        raise typer.Exit(exc.exit_code) from None
    finally:
        prepared.release()
    if as_json:
        from launcher.rundir import RunDir

        summary_path = RunDir(prepared.run_dir).summary
        from launcher import runfiles

        try:
            summary = runfiles.read_json_object(summary_path) if summary_path.is_file() else None
        except (OSError, ValueError):
            summary = None
        _print_json({"run_dir": str(prepared.run_dir), "exit_code": 0, "summary": summary})


def _run_detached(args: list[str], as_json: bool) -> None:
    """`run --detach`: start the run in the background and say how to follow and stop it."""
    from launcher.launch.detach import Refused, launcher_log, start

    started = start(args, relay=not as_json)
    if isinstance(started, Refused):  # refused or failed before it held the run directory
        if as_json:
            _print_json({"error": started.said.strip(), "exit_code": started.exit_code})
        raise typer.Exit(started.exit_code)
    name = started.name
    document = {
        "run_dir": str(started.run_dir),
        "name": name,
        "pid": started.pid,
        "log": str(launcher_log(started.run_dir)),
        "follow": f"llmtrain logs {name} --follow",
        "cancel": f"llmtrain cancel {name}",
    }
    if as_json:
        _print_json(document)
        return
    out.print(f"started {name} in the background (pid {started.pid})", markup=False)
    out.print(f"follow it: llmtrain logs {name} --follow", markup=False)
    out.print(f"stop it:   llmtrain cancel {name}", markup=False)


@app.command()
def calibrate(
    overrides: Overrides = None,
    config: ConfigFile = None,
    out_path: Annotated[
        str | None,
        typer.Option("--out", help="Also write the profile here (merged if it is one already)."),
    ] = None,
    no_cache: Annotated[
        bool,
        typer.Option(
            "--no-cache",
            help="Do not write the cache (~/.cache/llmtrain/profiles/GPU.json) that plan reads.",
        ),
    ] = False,
    budget: Annotated[
        float | None,
        typer.Option("--budget", help="Seconds to spend (default 60 on the CPU, 120 on a GPU)."),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Write the profile even when figures are noise (repeats spread too wide, a "
            "busy machine) or not physical; it is marked forced and plan says so.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Time, on this machine, the operators the planner prices for this configuration (GEMMs,
    attention, element-wise work, loss, optimizer, local collectives) and write a profile that
    `plan` then prices from."""
    from pathlib import Path

    from launcher.config.compose import compose_config
    from launcher.validate.rules import check
    from launcher.views.config import show_violations

    overrides = _with_config(config, overrides)
    composed = compose_config(overrides or [])
    violations = check(composed.config)
    if any(v.is_error for v in violations):
        show_violations(err, composed, violations)
        raise typer.Exit(2)
    if budget is not None and not budget > 0:
        raise UserError(f"--budget={budget}: must be a positive number of seconds, e.g. 60")
    if no_cache and out_path is None:
        raise UserError("--no-cache without --out writes nothing: add --out PATH")
    seconds = budget or (60.0 if composed.config.cluster.gpu == "cpu" else 120.0)
    out_file = Path(out_path).expanduser() if out_path else None
    if out_file is not None and out_file.is_dir():
        raise UserError(
            f"--out={out_path}: is a folder; give a file name, e.g. {out_path}/cpu.json"
        )
    from launcher.launch.calibrate import calibrate as run_calibration

    def progress(line: str) -> None:
        err.print(Text(line, style="dim"))

    start = time.monotonic()
    doc, written = run_calibration(
        composed.config,
        list(overrides or []),
        out=out_file,
        use_cache=not no_cache,
        progress=progress,
        budget_s=seconds,
        force=force,
    )
    took = time.monotonic() - start
    counts = {k: len(doc.get(k, [])) for k in ("gemm", "attention", "elementwise", "loss")}
    if as_json:
        _print_json({"written": [str(p) for p in written], "seconds": took, "profile": doc})
        return
    for note in doc.get("notes", []):
        err.print(Text("note ", style="yellow") + Text(note))
    quality = doc.get("quality") or {}
    for problem in quality.get("problems", []):
        err.print(Text("noise ", style="yellow") + Text(f"{problem} (kept: --force)"))
    for path in written:
        out.print(f"profile written: {path}")
    out.print(
        f"{counts['gemm']} GEMM shapes, {counts['attention']} attention, "
        f"{len(doc.get('collectives', []))} collective figures in the profile; measured in "
        f"{took:.1f} s. `llmtrain plan` now prices this device from it "
        "(cluster.profile=PATH picks a file; cluster.profile=none ignores profiles)."
    )


data_app = typer.Typer(
    help="Prepare training data: tokenize text, JSON Lines, parquet or saved datasets into shards."
)
app.add_typer(data_app, name="data")


@data_app.command("prepare")
def data_prepare(
    inputs: Annotated[
        list[str], typer.Option("--input", "-i", help="Text file or folder (repeatable).")
    ],
    output: Annotated[str, typer.Option("--output", "-o", help="Folder to write shards into.")],
    tokenizer: Annotated[
        str,
        typer.Option(
            help="byte (default), bpe (trained here), or the path of a Hugging Face tokenizer.json."
        ),
    ] = "byte",
    vocab_size: Annotated[int, typer.Option(help="BPE vocabulary size.")] = 4096,
    text_key: Annotated[
        str, typer.Option("--text-key", help="Field of .jsonl/.json/parquet records to read.")
    ] = "text",
    eod_token: Annotated[
        str | None,
        typer.Option("--eod-token", help="End-of-document token of a tokenizer.json."),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Replace an earlier prepared dataset at --output."),
    ] = False,
    allow_binary: Annotated[
        bool, typer.Option("--allow-binary", help="Tokenize inputs that do not look like text.")
    ] = False,
    valid_fraction: Annotated[
        float,
        typer.Option(
            "--valid-fraction",
            help="Share of whole documents held out for validation (evenly spread, by order).",
        ),
    ] = 0.01,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="megatron: train/valid PREFIX.bin/.idx (Megatron-LM reads them too); "
            "shards: llmtrain's own shard files.",
        ),
    ] = "megatron",
    input_format: Annotated[
        str | None,
        typer.Option(
            "--input-format",
            help="text, chat (messages / conversations records) or instruct (prompt/completion); "
            "default: told from the records.",
        ),
    ] = None,
    chat_template: Annotated[
        str | None,
        typer.Option(
            "--chat-template",
            help="A Jinja chat template file (default: the chat_template of the "
            "tokenizer_config.json beside --tokenizer).",
        ),
    ] = None,
    seq_length: Annotated[
        int | None,
        typer.Option(
            "--seq-length",
            help="Chat data: report how it packs into rows of this model.seq_length.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Tokenize text into a train and a validation split with an index (then data.path=OUTPUT).

    Chat and instruct records (docs/finetuning.md) keep per-token loss roles; data.train_on,
    data.packing and data.overlong apply when a run reads them."""
    from pathlib import Path

    if tokenizer not in ("byte", "bpe") and not Path(tokenizer).expanduser().is_file():
        raise UserError(
            f"--tokenizer={tokenizer}: must be byte, bpe, or the path of a tokenizer.json file"
        )
    if vocab_size < 256 + 1 and tokenizer == "bpe":
        raise UserError(f"--vocab-size={vocab_size}: a BPE vocabulary needs more than 256 entries")
    from launcher.data.prepare import prepare

    index = prepare(
        [Path(p) for p in inputs],
        Path(output),
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        overwrite=overwrite,
        allow_binary=allow_binary,
        text_key=text_key,
        eod_token=eod_token,
        report=lambda line: err.print(Text(line, style="dim")),
        valid_fraction=valid_fraction,
        fmt=fmt,
        input_format=input_format,
        chat_template=chat_template,
        byte_eod=True,  # byte tokens: id 256 ends each document (vocabulary 257)
    )
    document = index.to_json()
    if index.layout == "chat":
        from launcher.data.chat_report import packing_reports

        document["packing"] = packing_reports(Path(output), seq_length)
    if as_json:
        _print_json(document)
    elif index.layout == "chat":
        chat = document["chat"]
        out.print(
            f"wrote {chat['train_examples']:,} training and {chat['valid_examples']:,} validation "
            f"{chat['input_format']} examples ({document['total_tokens']:,} tokens, "
            f"{chat['assistant_tokens']:,} of them assistant tokens) to {output} (vocab "
            f"{document['vocab_size']}, template {chat['template']}); train on it with "
            f"data.path={output}"
        )
        for line in document["packing"]["lines"]:
            out.print(line)
    else:
        files = (
            ", ".join(f"{p}.bin/.idx" for p in document["megatron_prefixes"].values())
            if document["layout"] == "megatron"
            else f"{len(document['shards'])} shard(s)"
        )
        out.print(
            f"wrote {document['total_tokens']:,} training and {document['valid_tokens']:,} "
            f"validation tokens ({files}) to {output} (vocab {document['vocab_size']}, "
            f"{document['tokenizer']}, end of document id {document['eod_id']}); train on it "
            f"with data.path={output}"
        )


@app.command()
def export(
    run_dir: Annotated[
        str,
        typer.Argument(
            help="The run: its name as `llmtrain runs` lists it (or a unique prefix) or folder.",
            autocompletion=_complete_run,
        ),
    ],
    out_dir: Annotated[str, typer.Option("--out", "-o", help="Folder to write the model into.")],
    fmt: Annotated[str, typer.Option("--format", help="Output format: hf (Hugging Face).")] = "hf",
    step: Annotated[
        int | None, typer.Option("--step", help="Checkpoint step (default: newest valid).")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a non-empty --out folder.")
    ] = False,
    root: Annotated[
        str, typer.Option("--root", help="The folder holding run directories (run.root_dir).")
    ] = "runs",
    adapter: Annotated[
        bool, typer.Option("--adapter", help="A LoRA run's adapters alone, as a PEFT folder.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Export a run's checkpoint as a Hugging Face model folder (safetensors, config, tokenizer);
    a LoRA run's adapters merged into its base, or alone with --adapter."""
    from pathlib import Path

    if fmt != "hf":
        raise UserError(f"--format={fmt}: the only export format is hf (Hugging Face)")
    from launcher.launch.local_runs import CHECKPOINTED, resolve_run
    from launcher.train.hf_export import export_hf

    # A run's name under --root, as `status`/`logs`/`cancel` take it; a name that several runs
    # begin with: the newest that holds a checkpoint (a note names the others).
    resolved = resolve_run(run_dir, Path(root), CHECKPOINTED)
    if resolved.note:
        err.print(Text("note: ", style="yellow") + Text(resolved.note))
    folder = resolved.folder or Path(run_dir)
    result = export_hf(folder, Path(out_dir), step=step, overwrite=overwrite, adapter=adapter)
    if as_json:
        _print_json(result.to_json())
    else:
        out.print(
            f"exported step {result.step} of {run_dir} as {result.architecture} "
            f"({result.parameters:,} parameters) to {result.out}; tokenizer: {result.tokenizer}"
        )


@app.command()
def sample(
    run_dir: Annotated[str, typer.Argument(help="The run: its name (or prefix) or folder.")],
    prompt: Annotated[str, typer.Argument(help="The text to continue.")],
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", help="Tokens to generate (1-512).")
    ] = 32,
    step: Annotated[
        int | None, typer.Option("--step", help="Checkpoint step (default: newest valid).")
    ] = None,
    root: Annotated[
        str, typer.Option("--root", help="The folder holding run directories (run.root_dir).")
    ] = "runs",
    raw: Annotated[
        bool,
        typer.Option(
            "--raw", help="Continue PROMPT as plain text, without the data's chat template."
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Print a short greedy reply to PROMPT from a run's model (LoRA adapters applied): one user
    message in the run data's chat template when it has one, else a continuation of the text."""
    from pathlib import Path

    from launcher.launch.local_runs import find_run
    from launcher.train.sample import sample as run_sample

    folder = find_run(run_dir, Path(root)) or Path(run_dir)
    result = run_sample(folder, prompt, max_new_tokens=max_new_tokens, step=step, chat=not raw)
    if as_json:
        _print_json(result.to_json())
    elif result.template is not None:  # a chat reply: the reply alone, below the prompt
        out.print(f"user: {result.prompt}\nassistant: {result.text}", markup=False, highlight=False)
    else:
        out.print(result.prompt + result.text, markup=False, highlight=False)


@app.command()
def recipes(as_json: JsonFlag = False) -> None:
    """List the shipped recipes: parameters, layout, GPUs."""
    from launcher.views.config import recipe_rows, show_recipes

    rows = recipe_rows()
    if as_json:
        _print_json(rows)
    else:
        show_recipes(out, rows)


@app.command()
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
    overrides = _with_config(config, overrides)
    from launcher.config.compose import compose_config
    from launcher.render.artifacts import render_artifacts, write_artifacts
    from launcher.validate.rules import check
    from launcher.views.config import show_violations

    composed = compose_config(overrides or [])
    violations = check(composed.config)
    if any(v.is_error for v in violations):
        if as_json:
            from launcher.views.config import validation_document

            _print_json(validation_document(composed, violations))
        else:
            show_violations(err, composed, violations)
        raise typer.Exit(2)
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
        _print_json({"out_dir": out_dir, "files": [str(path) for path in written]})
        return
    for path in written:
        out.print(str(path))


JobArg = Annotated[
    str,
    typer.Argument(
        help="A run's name (as `llmtrain runs` lists it), a run directory, or a SLURM job id.",
        autocompletion=_complete_run,
    ),
]
RootOption = Annotated[
    str,
    typer.Option("--root", help="The folder holding run directories (run.root_dir)."),
]


def _local_run(target: str, root: str, choose: str = "newest") -> Any:
    """The local run `target` names (a run directory without SLURM jobs, or a run's name under
    `root`), or None when it is a SLURM job or a run submitted with `llmtrain submit`. A name
    that several runs begin with resolves as `choose` says (launcher.launch.local_runs
    .resolve_run), with a note on stderr naming the others and what differs."""
    from pathlib import Path

    from launcher.launch.local_runs import resolve_run, run_info

    resolved = resolve_run(target, Path(root), choose)
    if resolved.folder is None:
        return None
    if resolved.note:
        err.print(Text("note: ", style="yellow") + Text(resolved.note))
    info = run_info(resolved.folder)
    return None if info.slurm_jobs else info


def _slurm_target(target: str, root: str, choose: str = "newest") -> str:
    """A run's name under `root` as its folder, for the SLURM commands."""
    from pathlib import Path

    from launcher.launch.local_runs import resolve_run
    from launcher.runfiles import is_job_id

    folder = resolve_run(target, Path(root), choose).folder
    if folder is not None:
        return str(folder)
    if not is_job_id(target) and not Path(target).expanduser().is_dir():
        raise UserError(
            f"{target}: no run of that name under {root}/ (`llmtrain runs` lists them), and "
            "neither a run directory nor a SLURM job id"
        )
    return target


def _when(epoch: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


@app.command("runs")
def runs_command(root: RootOption = "runs", as_json: JsonFlag = False) -> None:
    """List the runs under the run root: status, progress, last loss, when they started, and
    what tells them apart (backend, layout, the overrides they were started with)."""
    from pathlib import Path

    from launcher.launch.local_runs import list_runs

    infos = list_runs(Path(root))
    if as_json:
        _print_json({"root": root, "runs": [i.to_json() for i in infos]})
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


@app.command()
def submit(
    overrides: Overrides = None,
    config: ConfigFile = None,
    force: Annotated[
        bool, typer.Option("--force", help="Submit even if the plan predicts it will not fit.")
    ] = False,
    allow_config_change: AllowConfigChange = False,
    dry_run: DryRun = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit the run as a SLURM batch job (sbatch); print the job id and run directory."""
    overrides = _with_config(config, overrides)
    if dry_run:
        _verdict("submit", overrides or [], force=force, as_json=as_json)
        return
    from launcher.config.compose import compose_config
    from launcher.launch.slurm import submit as submit_job

    composed = compose_config(overrides or [])
    done = submit_job(composed, force=force, allow_config_change=allow_config_change)
    if as_json:
        _print_json({"job_ids": list(done.job_ids), "run_dir": str(done.run_dir)})
        return
    out.print(f"submitted job {' '.join(done.job_ids)}")
    out.print(f"run directory {done.run_dir}")
    err.print(
        Text(
            f"follow it: llmtrain status {done.job_ids[0]}; llmtrain logs --follow "
            f"{done.job_ids[0]}",
            style="dim",
        )
    )


@app.command()
def status(target: JobArg, root: RootOption = "runs", as_json: JsonFlag = False) -> None:
    """Where a run stands: a local run's state, progress, loss so far and the command that
    resumes it, or a submitted job's."""
    local = _local_run(target, root)
    if local is not None:
        from launcher.launch.run_record import metric_history

        history = metric_history(local.folder)
        if as_json:
            losses = [[int(r["step"]), r.get("loss")] for r in history]
            _print_json({**local.to_json(), "losses": losses})
        else:
            from launcher.views.runs import status_lines as local_lines

            for line in local_lines(local, history):
                out.print(line, highlight=False, markup=False, soft_wrap=True)
        return
    from launcher.launch.slurm import resolve, status_document, status_lines

    resolved = resolve(_slurm_target(target, root))
    if as_json:
        _print_json(status_document(resolved))
        return
    for line in status_lines(resolved):
        out.print(line)


RunArg = Annotated[
    str, typer.Argument(help="A run: its name as `llmtrain runs` lists it (or the start of it).")
]


@app.command()
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
    import shlex
    from pathlib import Path

    from launcher.config.differences import differences, flat_values
    from launcher.launch.local_runs import resolve_run
    from launcher.launch.run_record import config_values

    def run_values(name: str) -> tuple[Path, dict[str, Any]]:
        resolved = resolve_run(name, Path(root))
        if resolved.folder is None:
            raise UserError(f"{name}: no run of that name under {root}/ (`llmtrain runs`)")
        if resolved.note:
            err.print(Text("note: ", style="yellow") + Text(resolved.note))
        values = config_values(resolved.folder)
        if values is None:
            raise UserError(f"{resolved.folder / 'config.yaml'}: missing or not YAML keys")
        return resolved.folder, values

    folder, left = run_values(target)
    given = list(other or [])
    resumes: bool | None = None
    is_run = (
        len(given) == 1
        and not config
        and "=" not in given[0]
        and not given[0].startswith(("+", "~"))
    )
    if is_run:
        other_folder, right = run_values(given[0])
        right_label = other_folder.name
    else:
        from launcher.config.compose import compose_config
        from launcher.config.secrets import redact
        from launcher.launch.local import run_dir_for

        composed = compose_config(_with_config(config, given))
        right = redact(composed.values)
        typed = [*(["--config", config] if config else []), *given]
        right_label = shlex.join(["llmtrain", "run", *typed])
        with contextlib.suppress(UserError, OSError):
            resumes = run_dir_for(composed).resolve() == folder
    rows = differences(flat_values(left), flat_values(right))
    if as_json:
        _print_json(
            {
                "a": str(folder),
                "b": right_label,
                "differences": [{"key": k, "a": a, "b": b} for k, a, b in rows],
                "resumes": resumes,
            }
        )
        return
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


@app.command()
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
    from pathlib import Path

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
            err.print(Text("note: ", style="yellow") + Text(resolved.note))
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
        _print_json({"out": str(target), "runs": [n for n, _ in runs], "points": steps})
        return
    out.print(f"wrote {target}: {', '.join(n for n, _ in runs)} ({steps} steps)", markup=False)


@app.command()
def logs(
    target: JobArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job finishes.")
    ] = False,
    root: RootOption = "runs",
    as_json: JsonFlag = False,
) -> None:
    """Print a run's output: a local run's rank-0 log, or a submitted job's stdout and stderr."""
    from launcher.launch.slurm import log_files, read_log, resolve, show_logs

    if as_json and follow:
        raise UserError("--json prints the logs as they are now; drop --follow (or --json)")
    local = _local_run(target, root)
    if local is not None:
        from launcher.launch import local_runs

        if not as_json:
            local_runs.show_logs(local, _write_flush, follow=follow)
            return
        texts = local_runs.log_texts(local)  # the end of each log, bounded
    if as_json:
        if local is None:
            resolved = resolve(_slurm_target(target, root))
            texts = [(path, read_log(path, resolved.run_dir)) for path in log_files(resolved)]
        _print_json(
            {
                "files": [
                    {
                        "path": str(path),
                        "text": data.decode("utf-8", "replace") if data is not None else None,
                    }
                    for path, data in texts
                ]
            }
        )
        return

    show_logs(resolve(_slurm_target(target, root)), _write_flush, follow=follow)


def _write_flush(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@app.command()
def cancel(target: JobArg, root: RootOption = "runs", as_json: JsonFlag = False) -> None:
    """Stop a run: a local one as Ctrl-C would (it checkpoints, then exits), or cancel its
    submitted jobs; then wait until it stopped."""
    local = _local_run(target, root, "running")
    if local is not None:
        from launcher.launch.local_runs import cancel as cancel_local

        line = cancel_local(local)
        if as_json:
            _print_json({"runs": [line]})
        else:
            out.print(line, highlight=False, markup=False)
        return
    from launcher.launch.slurm import cancel as cancel_jobs
    from launcher.launch.slurm import resolve

    lines = cancel_jobs(resolve(_slurm_target(target, root, "running")))
    if as_json:
        _print_json({"jobs": lines})
        return
    for line in lines:
        out.print(line)


def entry() -> None:
    """Console-script entry point: user errors print one message and exit 2, no traceback."""
    try:
        from launcher.cli_hints import override_typed_as_option

        hint = override_typed_as_option(typer.main.get_command(app), sys.argv[1:])
        if hint:
            raise UserError(hint)
        app()
    except UserError as exc:
        if "--json" in sys.argv[1:]:
            problems = getattr(exc, "problems", None) or [str(exc)]
            _print_json({"error": str(exc), "problems": problems, "exit_code": exc.exit_code})
        else:
            err.print(Text("error: ", style="bold red") + Text(str(exc)))
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    entry()
