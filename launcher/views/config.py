"""Rich views for `show`, `validate` and `recipes`, and their JSON documents."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from launcher import resources
from launcher.backends import planning_preset_needs
from launcher.config.composition.compose import Composed, compose_config
from launcher.config.composition.provenance import flatten
from launcher.config.layout import Layout, derive_layout
from launcher.errors import ConfigError
from launcher.plan.model_shape import ModelShape, human_count
from launcher.validate.rules import Violation, check

if TYPE_CHECKING:
    from launcher.verdict import Verdict


def show_config(console: Console, composed: Composed, sources: dict[str, str] | None) -> None:
    if sources is None:
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        text = yaml.dump(
            composed.values, Dumper=dumper, sort_keys=False, default_flow_style=False, width=200
        )
        console.file.write(text)
        return
    values = flatten(composed.values)
    rows = [(key, _fmt(value), sources.get(key, "")) for key, value in values.items()]
    widest = max((len(k) + len(v) + len(src) for k, v, src in rows), default=0)
    if widest + 10 > console.width:
        # Too narrow for three columns (80 columns cut the source to `backend/torc…`): one
        # heading per source, its keys below it with their values, nothing cut.
        console.print(f"recipe={composed.choices.get('recipe')}, keys by where they came from:")
        by_source: dict[str, list[tuple[str, str]]] = {}
        for key, value, source in rows:
            by_source.setdefault(source or "(unknown)", []).append((key, value))

        def rank(source: str) -> int:  # what the user chose first, the schema's defaults last
            return 0 if source == "command line" else 2 if source == "schema default" else 1

        for source in sorted(by_source, key=rank):
            console.print(Text(source, style="bold"))
            for key, value in by_source[source]:
                console.print(Text("  ") + Text(key, style="cyan") + Text(f" = {value}"))
        return
    table = Table(title=f"recipe={composed.choices.get('recipe')}", title_justify="left")
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("source", style="dim")
    for key, value, source in rows:
        table.add_row(key, value, source)
    console.print(table)


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def layout_summary(layout: Layout) -> dict[str, Any]:
    return {
        "world_size": layout.world_size,
        "tp": layout.tp,
        "pp": layout.pp,
        "vpp": layout.vpp,
        "cp": layout.cp,
        "ep": layout.ep,
        "dp": layout.dp,
        "dp_inferred": layout.dp_inferred,
        "micro_batch_size": layout.micro_batch_size,
        "global_batch_size": layout.global_batch_size,
        "grad_accum": layout.grad_accum,
        "stage_layers": list(layout.stage_layers),
        "steps": layout.steps,
    }


def _layout_line(layout: Layout) -> str:
    inferred = " (inferred)" if layout.dp_inferred else ""
    line = (
        f"{layout.world_size} devices = tp {layout.tp} x pp {layout.pp} x cp {layout.cp} x "
        f"dp {layout.dp}{inferred}"
    )
    if layout.ep > 1:
        line += f", ep {layout.ep}"
    return (
        f"{line}; batch {layout.global_batch_size} = micro {layout.micro_batch_size} x dp "
        f"{layout.dp} x accum {layout.grad_accum}"
    )


def validation_document(composed: Composed, violations: list[Violation]) -> dict[str, Any]:
    def as_dict(v: Violation) -> dict[str, Any]:
        return {"rule": v.rule, "keys": list(v.keys), "message": v.message}

    return {
        "valid": not any(v.is_error for v in violations),
        "recipe": composed.choices.get("recipe"),
        "errors": [as_dict(v) for v in violations if v.is_error],
        "warnings": [as_dict(v) for v in violations if not v.is_error],
        "layout": layout_summary(derive_layout(composed.config)),
    }


def show_violations(console: Console, composed: Composed, violations: list[Violation]) -> None:
    errors = [v for v in violations if v.is_error]
    for v in violations:
        style, word = ("bold red", "error") if v.is_error else ("yellow", "warning")
        console.print(Text(f"{word} [{v.rule}] ", style=style) + Text(v.message))
    layout = derive_layout(composed.config)
    if errors:
        console.print(
            Text(f"{len(errors)} error(s); nothing was launched.", style="bold red"),
        )
    else:
        recipe = composed.choices.get("recipe")
        console.print(Text("valid ", style="bold green") + Text(f"recipe={recipe}: "))
        console.print(Text("  " + _layout_line(layout)))


def verdict_document(verdict: Verdict, command: str = "validate") -> dict[str, Any]:
    """The JSON of `validate` / `run --dry-run` / `submit --dry-run` (one shape for all three)."""

    def as_dict(v: Violation) -> dict[str, Any]:
        return {"rule": v.rule, "keys": list(v.keys), "message": v.message}

    composed = verdict.composed
    return {
        "command": command,
        "valid": verdict.valid,
        "exit_code": verdict.exit_code(command),
        "recipe": composed.choices.get("recipe") if composed else None,
        "backend": composed.config.backend.name if composed else None,
        "errors": [as_dict(v) for v in verdict.errors],
        "warnings": [as_dict(v) for v in verdict.violations if not v.is_error],
        "notes": list(verdict.notes),
        "refusals": {k: list(v) for k, v in verdict.refusals.items()},
        "layout": layout_summary(derive_layout(composed.config)) if composed else None,
    }


def show_verdict(console: Console, verdict: Verdict, command: str = "validate") -> None:
    """Errors and warnings, then notes (planning preset, what run/submit would refuse), then the
    verdict line; the same screen for validate and the dry runs."""
    for v in verdict.violations:
        style, word = ("bold red", "error") if v.is_error else ("yellow", "warning")
        console.print(Text(f"{word} [{v.rule}] ", style=style) + Text(v.message))
    for note in verdict.notes:
        console.print(Text("note ", style="cyan") + Text(note))
    errors = verdict.errors
    if errors:
        console.print(Text(f"{len(errors)} error(s); nothing was launched.", style="bold red"))
        return
    assert verdict.composed is not None
    recipe = verdict.composed.choices.get("recipe")
    console.print(Text("valid ", style="bold green") + Text(f"recipe={recipe}: "))
    console.print(Text("  " + _layout_line(derive_layout(verdict.composed.config))))
    if command != "validate":
        refused = verdict.refusals.get(command)
        word = "would refuse" if refused else "would launch"
        console.print(
            Text(f"{command} --dry-run: {word}", style="bold red" if refused else "bold green")
            + Text(" (nothing was started or written)")
        )


def recipe_rows() -> list[dict[str, Any]]:
    """One row per shipped recipe: its shape, parameters, layout and hardware."""
    rows: list[dict[str, Any]] = []
    for name in resources.recipe_names():
        try:
            cfg = compose_config([f"recipe={name}"]).config
        except ConfigError as exc:
            rows.append({"name": name, "error": str(exc)})
            continue
        shape = ModelShape(cfg.model)
        layout = derive_layout(cfg)
        errors = [v.message for v in check(cfg) if v.is_error]
        needs = planning_preset_needs(cfg)
        rows.append(
            {
                "name": name,
                "model": cfg.model.name,
                "params": shape.total_params(),
                "active_params": shape.active_params(),
                "tp": layout.tp,
                "pp": layout.pp,
                "cp": layout.cp,
                "ep": layout.ep,
                "dp": layout.dp,
                "zero": cfg.zero.stage,
                "precision": cfg.precision.name,
                "backend": cfg.backend.name,
                "gpu": cfg.cluster.gpu,
                "gpus": layout.world_size,
                "seq_length": cfg.model.seq_length,
                "valid": not errors,
                # Runnable by an engine here (run/submit), or a planning preset and what it needs.
                "runnable": needs is None,
                "needs": needs,
            }
        )
    return rows


def show_recipes(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table(title="llmtrain recipes  (llmtrain show recipe=NAME)", title_justify="left")
    for column, justify in (
        ("recipe", "left"),
        ("parameters", "right"),
        ("layout", "left"),
        ("GPUs", "right"),
        ("backend", "left"),
    ):
        table.add_column(column, justify=justify, no_wrap=column in ("recipe", "backend"))  # type: ignore[arg-type]
    for row in rows:
        if "error" in row:
            table.add_row(row["name"], "", Text(row["error"], style="red"), "", "")
            continue
        params = human_count(row["params"])
        if row["active_params"] != row["params"]:
            params += f" ({human_count(row['active_params'])} active)"
        layout = f"tp{row['tp']} pp{row['pp']} dp{row['dp']}"
        layout += f" cp{row['cp']}" if row["cp"] > 1 else ""
        layout += f" ep{row['ep']}" if row["ep"] > 1 else ""
        layout += f" zero{row['zero']} {row['precision']}"
        if not row["valid"]:
            layout += " (invalid: llmtrain validate)"
        backend = f"{row['backend']} ({'run' if row['runnable'] else 'plan'})"
        table.add_row(row["name"], params, layout, f"{row['gpus']} x {row['gpu']}", backend)
    console.print(table)
    needs = sorted({row["needs"] for row in rows if row.get("needs")})
    console.print(
        "(run): `llmtrain run`/`submit` train it here.  (plan): a planning preset; run/submit "
        f"need {', '.join(needs) or 'another engine'} (`llmtrain render` writes its arguments)."
    )
