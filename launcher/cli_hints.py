"""What the command line says when a config key is typed the way other tools take options
(`llmtrain run --recipe gpt-7b`, `--steps 5`), and what shell completion offers for overrides
(recipe names, group options, config keys). Pure: no torch, no Hydra compose."""

from __future__ import annotations

from collections.abc import Sequence

import click


def _keys_named(name: str) -> list[str]:
    """Config keys or groups an option name stands for: `recipe`, `parallel.tp`, `steps` ->
    train.steps (a leaf name that is unique enough to mean something)."""
    from launcher.config.composition.compose import all_schema_keys, groups

    name = name.replace("-", "_")
    if name in groups() or name in all_schema_keys():
        return [name]
    return [key for key in all_schema_keys() if key.rsplit(".", 1)[-1] == name]


def override_typed_as_option(root: click.Command, argv: Sequence[str]) -> str | None:
    """The message for an undeclared `--NAME [VALUE]` that names a config key or group, or None
    (click then reports any other unknown option itself)."""
    command = root
    i = 0
    while isinstance(command, click.Group) and i < len(argv) and argv[i] in command.commands:
        command = command.commands[argv[i]]
        i += 1
    if command is root:
        return None
    declared = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    for j in range(i, len(argv)):
        token = argv[j]
        if token == "--":
            break
        if not token.startswith("--") or token.split("=", 1)[0] in declared:
            continue
        name, eq, value = token[2:].partition("=")
        keys = _keys_named(name)
        if not keys:
            continue
        if not eq:
            following = argv[j + 1] if j + 1 < len(argv) else ""
            value = following if following and not following.startswith("-") else ""
            value = "" if "=" in value else value
        shown = " or ".join(f"{key}={value or 'VALUE'}" for key in keys[:4])
        return (
            f"{token.split('=', 1)[0]} is not an option of `llmtrain {' '.join(argv[:i])}`: "
            f"config keys are given as overrides, e.g. {shown}"
        )
    return None


def complete_override(incomplete: str, args: Sequence[str] = ()) -> list[str]:
    """Shell completion for an override: `recipe=<TAB>` -> recipe names, `cluster=h1<TAB>` ->
    cluster options, `parallel.<TAB>` -> keys under parallel, otherwise groups and keys.

    zsh and fish pass the whole word (`recipe=ll`). bash splits words at '=' (COMP_WORDBREAKS),
    so it asks with the words before the cursor ending in `recipe`, `=` and the value typed so far
    (`ll`), or ending in `recipe` with `=` itself as the word; bash then replaces only the text
    after the '=', so the answer is the bare value (`llama3-70b`)."""
    from launcher.config.composition.compose import all_schema_keys, groups

    if incomplete == "=" and args:  # bash: `recipe=<TAB>`
        return _values_of(args[-1].lstrip("+~"), "")
    if len(args) >= 2 and args[-1] == "=":  # bash: `recipe=ll<TAB>`
        return _values_of(args[-2].lstrip("+~"), incomplete)
    prefix = incomplete.lstrip("+~")
    lead = incomplete[: len(incomplete) - len(prefix)]
    if "=" in prefix:
        key, _, partial = prefix.partition("=")
        return [f"{lead}{key}={value}" for value in _values_of(key, partial)]
    candidates = [f"{g}=" for g in groups()] + [f"{k}=" for k in all_schema_keys()]
    return [f"{lead}{c}" for c in candidates if c.startswith(prefix)]


def _values_of(key: str, partial: str) -> list[str]:
    """The values a group or a fixed-choice key takes that start with `partial`."""
    from launcher.config.composition.compose import group_options, groups
    from launcher.config.schema.key_info import choices
    from launcher.config.schema.keys import field_type

    if key in groups():
        values = list(group_options(key))
    elif key in choices():
        values = list(choices()[key])
    elif field_type(key) in (bool, bool | None):
        values = ["true", "false"]
    else:
        return []
    return [v for v in values if v.startswith(partial)]


def complete_run_name(root: str, incomplete: str) -> list[str]:
    """The names of the run directories under `root` that start with `incomplete` (for
    status, logs, cancel and export); nothing when `root` is not a folder."""
    from pathlib import Path

    from launcher.launch.local_runs import is_run_dir

    folder = Path(root).expanduser()
    if "/" in incomplete or not folder.is_dir():
        return []
    try:
        names = sorted(p.name for p in folder.iterdir() if p.name.startswith(incomplete))
    except OSError:
        return []
    return [name for name in names if is_run_dir(folder / name)]
