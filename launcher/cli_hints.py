"""What the command line says when a config key is typed the way other tools take options
(`llmtrain run --recipe gpt-7b`, `--steps 5`), and what shell completion offers for overrides
(recipe names, group options, config keys). Pure: no torch, no Hydra compose."""

from __future__ import annotations

from collections.abc import Sequence

import click


def _keys_named(name: str) -> list[str]:
    """Config keys or groups an option name stands for: `recipe`, `parallel.tp`, `steps` ->
    train.steps (a leaf name that is unique enough to mean something)."""
    from launcher.config.compose import all_schema_keys, groups

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


def complete_override(incomplete: str) -> list[str]:
    """Shell completion for an override: `recipe=<TAB>` -> recipe names, `cluster=h1<TAB>` ->
    cluster options, `parallel.<TAB>` -> keys under parallel, otherwise groups and keys."""
    from launcher.config.compose import all_schema_keys, group_options, groups

    prefix = incomplete.lstrip("+~")
    lead = incomplete[: len(incomplete) - len(prefix)]
    if "=" in prefix:
        key, _, partial = prefix.partition("=")
        if key in groups():
            return [f"{lead}{key}={o}" for o in group_options(key) if o.startswith(partial)]
        return []
    candidates = [f"{g}=" for g in groups()] + [f"{k}=" for k in all_schema_keys()]
    return [f"{lead}{c}" for c in candidates if c.startswith(prefix)]
