"""`plan` (one layout, `--search` over layouts, `--measure` on this machine, `--json-schema`) and
`calibrate`: what a configuration will cost, predicted or measured. The decisions (which backend
a layout is planned with, which configurations a search ranks) are launcher.verdict's."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from launcher.commands.common import (
    ConfigFile,
    JsonFlag,
    Overrides,
    compose_valid,
    err,
    out,
    print_json,
    refuse_invalid,
    with_config,
)
from launcher.errors import UserError

if TYPE_CHECKING:
    from launcher.config.composition.compose import Composed
    from launcher.verdict import PlanVerdict

Headroom = Annotated[
    float,
    typer.Option(
        "--headroom",
        "--min-headroom",
        help="Memory kept free, as a fraction of the GPU's capacity.",
    ),
]
Search = Annotated[
    bool,
    typer.Option(
        "--search",
        help="Search every valid layout for the fastest that fits (keys given are kept).",
    ),
]
Top = Annotated[int, typer.Option(help="With --search: layouts to show.")]
MaxTp = Annotated[int | None, typer.Option(help="With --search: largest tp.")]
MaxPp = Annotated[int | None, typer.Option(help="With --search: largest pp.")]
AnyBackend = Annotated[
    bool,
    typer.Option(
        "--any-backend",
        help="With --search: rank the layouts of every backend, not only the configured one.",
    ),
]
JsonSchema = Annotated[
    bool,
    typer.Option("--json-schema", help="Print the JSON Schema of the --json document."),
]
Measure = Annotated[
    bool,
    typer.Option(
        "--measure",
        help="Train the model shrunk to 1 and 2 layers per pipeline chunk for a few real "
        "steps on this machine and extrapolate step time and memory to the full model.",
    ),
]
Detail = Annotated[
    bool,
    typer.Option(
        "--detail",
        help="Also print memory by bucket and stage, the pipeline timeline, collectives, "
        "totals and every assumption.",
    ),
]


def plan(
    overrides: Overrides = None,
    config: ConfigFile = None,
    headroom: Headroom = 0.10,
    search: Search = False,
    top: Top = 10,
    max_tp: MaxTp = None,
    max_pp: MaxPp = None,
    any_backend: AnyBackend = False,
    json_schema: JsonSchema = False,
    measure: Measure = False,
    detail: Detail = False,
    as_json: JsonFlag = False,
) -> None:
    """Predict per-GPU memory, step time, MFU, communication, cost and checkpoint cadence."""
    overrides = with_config(config, overrides)
    if measure:
        if search:
            raise UserError("--measure and --search: pick one (measure plans one layout)")
        plan_measure(list(overrides or []), as_json=as_json)
        return
    if json_schema:
        from launcher.views.plan_schema import plan_json_schema

        print_json(plan_json_schema())
        return
    if not 0 <= headroom < 1:
        raise UserError(f"--headroom={headroom}: must be a fraction in [0, 1), e.g. 0.10")
    from launcher.config.composition.compose import compose_config

    composed = compose_config(overrides or [])
    if search:
        options: dict[str, Any] = {"top": top, "min_headroom": headroom}
        options.update(max_tp=max_tp, max_pp=max_pp)
        plan_search(composed, overrides, options, any_backend=any_backend, as_json=as_json)
        return
    from launcher.verdict import plan_verdict

    found = plan_verdict(composed, headroom=headroom)
    if found.plan is None:
        refuse_invalid(composed, list(found.violations), as_json=as_json)
    show_plan(found, detail=detail, as_json=as_json)


def plan_search(
    composed: Composed,
    overrides: list[str],
    options: dict[str, Any],
    *,
    any_backend: bool,
    as_json: bool,
) -> None:
    """`plan --search`: the fastest layouts that fit (of every backend with `any_backend`)."""
    from launcher.search.layouts import fixed_keys, search_backends
    from launcher.search.layouts import search as search_layouts
    from launcher.verdict import search_configs
    from launcher.views.search import render_search, search_to_json

    options["fixed"] = fixed_keys(overrides) - {"backend", "backend.name"}
    if any_backend:
        configs = search_configs(composed, overrides, any_backend=True)
        result = search_backends(configs, **options)
    else:
        result = search_layouts(composed.config, **options)
    if as_json:
        print_json(search_to_json(result))
        return
    from launcher.config.composition.provenance import flatten

    given = None if any_backend else flatten(composed.values)
    render_search(result, out, given_values=given)


def show_plan(found: PlanVerdict, *, detail: bool, as_json: bool) -> None:
    """The plan (a JSON document, or the report with its warnings and notes on stderr)."""
    from launcher.plan.document import plan_to_json
    from launcher.views.plan import render_plan

    plan, substitute, notes = found.plan, found.substitute, found.composed.notes
    assert plan is not None  # the caller refused a configuration without one
    if as_json:
        document = plan_to_json(plan)
        document["warnings"] = [v.message for v in found.violations] + list(notes)
        if substitute is not None:
            document["backend_substituted"] = {
                "requested": substitute.requested,
                "planned": substitute.planned,
                "reasons": list(substitute.reasons),
            }
        print_json(document)
        return
    for v in found.violations:
        err.print(Text(f"warning [{v.rule}] ", style="yellow") + Text(v.message))
    for note in notes:  # what model.from_hf did not carry over
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
    if plan.profile_note:
        err.print(Text("note ", style="yellow") + Text(plan.profile_note))
    render_plan(plan, out, detail=detail)


def _progress(line: str) -> None:
    err.print(Text(line, style="dim"))


def plan_measure(overrides: list[str], *, as_json: bool) -> None:
    """`plan --measure`: train shrunk copies of the model here and extrapolate."""
    from launcher.launch.measure import measure, table, to_json

    compose_valid(overrides, json_errors=as_json)
    result = measure(overrides, _progress)
    if as_json:
        print_json(to_json(result))
    else:
        sys.stdout.write(table(result) + "\n")


OutPath = Annotated[
    str | None,
    typer.Option("--out", help="Also write the profile here (merged if it is one already)."),
]
NoCache = Annotated[
    bool,
    typer.Option(
        "--no-cache",
        help="Do not write the cache (~/.cache/llmtrain/profiles/GPU.json) that plan reads.",
    ),
]
Budget = Annotated[
    float | None,
    typer.Option("--budget", help="Seconds to spend (default 60 on the CPU, 120 on a GPU)."),
]
NoOverhead = Annotated[
    bool,
    typer.Option(
        "--no-overhead",
        help="Skip the two short cut runs that measure the layout's per-step overhead "
        "(waits, small collectives, dispatch); plan then prices from the operators alone.",
    ),
]
ForceProfile = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Write the profile even when figures are noise (repeats spread too wide, a "
        "busy machine) or not physical; it is marked forced and plan says so.",
    ),
]


def calibrate(
    overrides: Overrides = None,
    config: ConfigFile = None,
    out_path: OutPath = None,
    no_cache: NoCache = False,
    budget: Budget = None,
    force: ForceProfile = False,
    no_overhead: NoOverhead = False,
    as_json: JsonFlag = False,
) -> None:
    """Time, on this machine, the operators the planner prices for this configuration (GEMMs,
    attention, element-wise work, loss, optimizer, local collectives) and write a profile that
    `plan` then prices from."""
    from pathlib import Path

    overrides = with_config(config, overrides)
    composed, _ = compose_valid(overrides or [], json_errors=as_json)
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

    start = time.monotonic()
    doc, written = run_calibration(
        composed.config,
        list(overrides or []),
        out=out_file,
        use_cache=not no_cache,
        progress=_progress,
        budget_s=seconds,
        force=force,
        overhead=not no_overhead,
    )
    took = time.monotonic() - start
    if as_json:
        print_json({"written": [str(p) for p in written], "seconds": took, "profile": doc})
        return
    show_profile(doc, written, took)


def show_profile(doc: dict[str, Any], written: list[Any], took: float) -> None:
    """What `calibrate` measured and wrote, and its noise warnings (on stderr)."""
    counts = {k: len(doc.get(k, [])) for k in ("gemm", "attention", "elementwise", "loss")}
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
