"""The `llmtrain` command line: the app, its commands (launcher/commands/, one module per
concern: each parses, calls one function per step, prints), shell completion, and the entry
point that turns a user error into one message and exit 2.

Commands here never import torch or deepspeed (see tests/unit/commands/test_cli_imports.py).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.text import Text

from launcher import __version__
from launcher.commands import config, data, models, planning, runs, training
from launcher.commands.common import StdoutClosed, err, out, print_json
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


def _bash_keeps_a_key_open() -> None:
    """bash appends a space after the one completion it inserts; after `parallel.tp=` that would
    leave `parallel.tp= 8` (two words). Typer's bash script (the one --install-completion writes
    and `_LLMTRAIN_COMPLETE=source_bash` prints) gains `compopt -o nospace` for a single
    completion ending in '='; and where the program answers NOTHING (an override with no value
    to offer, `parallel.tp=`), no completion at all instead of bash's fallback to the names of
    the files here (`complete -o default`, which a path's value and `--config FILE` keep). Left
    as it is if a Typer release words its script otherwise."""
    from typer import _completion_classes, _completion_shared

    from launcher.cli_hints import NOTHING

    script = _completion_shared.COMPLETION_SCRIPT_BASH
    end = "    return 0\n}"
    if end not in script or "compopt" in script:
        return
    patched = script.replace(
        end,
        "    [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == *= ]] && compopt -o nospace\n"
        f"    [[ ${{#COMPREPLY[@]}} -eq 1 && ${{COMPREPLY[0]}} == *{NOTHING} ]] && "
        "{ COMPREPLY=(); compopt +o default; }\n" + end,
    )
    _completion_shared._completion_scripts["bash"] = patched
    _completion_classes.BashComplete.source_template = patched


_bash_keeps_a_key_open()


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


# The commands, in the order `llmtrain --help` lists them.
app.command()(config.show)
app.command()(config.validate)
app.command()(planning.plan)
app.command()(training.run)
app.command()(planning.calibrate)
app.add_typer(data.data_app, name="data")
app.command()(models.export)
app.command()(models.sample)
app.command()(config.recipes)
app.command()(config.render)
app.command("runs")(runs.runs_command)
app.command()(training.submit)
app.command()(runs.status)
app.command()(runs.diff)
app.command()(runs.plot)
app.command()(runs.logs)
app.command()(runs.cancel)


def entry() -> None:
    """Console-script entry point: user errors print one message and exit 2, no traceback; a
    reader that went away (`llmtrain show | head`) ends the command quietly with exit 0, as
    `cat` and `git log` end at `| head`."""
    try:
        from launcher.cli_hints import override_typed_as_option

        hint = override_typed_as_option(typer.main.get_command(app), sys.argv[1:])
        if hint:
            raise UserError(hint)
        app()
    except UserError as exc:
        if "--json" in sys.argv[1:]:
            problems = getattr(exc, "problems", None) or [str(exc)]
            print_json({"error": str(exc), "problems": problems, "exit_code": exc.exit_code})
        else:
            err.print(Text("error: ", style="bold red") + Text(str(exc)))
        sys.exit(exc.exit_code)
    except StdoutClosed:
        from launcher.launch.console import silence_stdout

        silence_stdout()  # Python's flush at exit must not fail on the closed pipe either
        sys.exit(0)


if __name__ == "__main__":
    entry()
