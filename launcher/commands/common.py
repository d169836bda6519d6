"""What every command shares: the consoles, JSON output, the argument types (with their shell
completion), `--config FILE`, and compose-check-or-exit (exit 2 naming every problem)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from launcher.config.composition.compose import Composed
    from launcher.validate.rules import Violation

out = Console(highlight=False, soft_wrap=False)
# Errors and notes wrap at the width of a terminal; into a pipe or a file each stays one line,
# whole, for grep and for the tests that read it.
err = Console(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty())


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")


def write_flush(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def tell(console: Console, text: Text) -> None:
    """A message of a long-running command (`run`): its terminal may have closed or its pipe's
    reader gone meanwhile (EIO, EPIPE), which must not turn the run's outcome into a traceback
    or change its exit code."""
    try:
        console.print(text)
    except (OSError, ValueError):
        from launcher.launch.console import silence_stdout

        silence_stdout()


def note(text: str, *, label: str = "note: ") -> None:
    """A yellow-labelled note on stderr (a run name that several runs begin with, ...)."""
    err.print(Text(label, style="yellow") + Text(text))


def complete_override(incomplete: str) -> list[str]:
    import os

    from launcher.cli_hints import complete_override as complete

    # bash hands over its own words (split at '=' too, by COMP_WORDBREAKS) and which one the
    # cursor is in; Typer passes none of the words before it, so they are read here.
    words, cword = os.environ.get("COMP_WORDS"), os.environ.get("COMP_CWORD", "")
    if words is not None and cword.isdigit():
        from click.shell_completion import split_arg_string

        split = split_arg_string(words)
        at = int(cword)
        return complete(split[at] if at < len(split) else "", split[1:at])
    return complete(incomplete)


def complete_run(ctx: typer.Context, incomplete: str) -> list[str]:
    from launcher.cli_hints import complete_run_name

    return complete_run_name(str(ctx.params.get("root") or "runs"), incomplete)


Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Hydra overrides, e.g. recipe=llama3-70b parallel.tp=8 zero.stage=3",
        autocompletion=complete_override,
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
JobArg = Annotated[
    str,
    typer.Argument(
        help="A run's name (as `llmtrain runs` lists it), a run directory, or a SLURM job id.",
        autocompletion=complete_run,
    ),
]
RootOption = Annotated[
    str,
    typer.Option("--root", help="The folder holding run directories (run.root_dir)."),
]


def with_config(config: str | None, overrides: list[str] | None) -> list[str]:
    """--config FILE as the overrides it stands for, before the command line's (which win)."""
    if not config:
        return list(overrides or [])
    from launcher.config.composition.config_file import expand

    return expand(config, list(overrides or []))


def refuse_invalid(composed: Composed, violations: list[Violation], *, as_json: bool) -> None:
    """Print every problem (a JSON document with `as_json`, else on stderr) and exit 2."""
    if as_json:
        from launcher.views.config import validation_document

        print_json(validation_document(composed, violations))
    else:
        from launcher.views.config import show_violations

        show_violations(err, composed, violations)
    raise typer.Exit(2)


def compose_valid(overrides: list[str], *, json_errors: bool) -> tuple[Composed, list[Violation]]:
    """The composed configuration and its warnings; when a rule reports an error, every problem
    is printed and the command exits 2 (as a JSON document with `json_errors`)."""
    from launcher.config.composition.compose import compose_config
    from launcher.validate.rules import check

    composed = compose_config(overrides)
    violations = check(composed.config)
    if any(v.is_error for v in violations):
        refuse_invalid(composed, violations, as_json=json_errors)
    return composed, violations
