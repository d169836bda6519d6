"""The plan as a stable JSON document and as a Rich report (rich is imported here only)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from launcher.backends.engine_choices import engine_choices
from launcher.config.epoch_rows import budget_note
from launcher.plan.calibration.bands import ErrorBand, error_band
from launcher.plan.document import plan_to_json
from launcher.plan.finetune import summary as finetune_summary
from launcher.plan.fixes import Fix
from launcher.plan.memory.build_peak import build_line
from launcher.plan.memory.estimate import GIB, VERDICT_WORDS
from launcher.plan.planner import Plan, pricing_line
from launcher.plan.preference import reference_forward_s
from launcher.plan.preference import summary as pairs_summary
from launcher.plan.schedule import timeline

__all__ = ["band_text", "plan_to_json", "render_plan"]

if TYPE_CHECKING:
    from rich.console import Console

BUCKETS = (
    ("weights", "blue"),
    ("gradients", "magenta"),
    ("optimizer", "yellow"),
    ("activations", "green"),
    ("buffers", "cyan"),
    ("fragmentation", "grey50"),
    ("overhead", "red"),
)


# Each bucket's glyph in the memory bar without colour (NO_COLOR).
GLYPHS = {
    "weights": "w",
    "gradients": "g",
    "optimizer": "o",
    "activations": "a",
    "buffers": "b",
    "fragmentation": "f",
    "overhead": "h",
}


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def _dur(s: float) -> str:
    if not math.isfinite(s):
        return "-"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def _bucket_values(plan: Plan) -> list[float]:
    h = plan.memory.heaviest
    return [
        h.weights,
        h.gradients,
        h.optimizer,
        h.activations,
        h.buffers,
        h.reserved - h.allocated,
        h.overhead,
    ]


def band_text(band: ErrorBand | None) -> str:
    """e.g. 'typically within +-8% (dense bf16, H100; leave-one-source-out)'."""
    if band is None:
        return ""
    return f"typically within ±{band.typical:.0%} ({band.regime}; {band.source})"


def time_band_text(plan: Plan) -> str:
    """The step time's band, or why none is stated: a profile whose figures calibrate marked
    as noise (kept with --force) earns none, and the published figures' band is theirs alone."""
    if plan.time_band is not None or plan.profile is None or not plan.profile.noise:
        return band_text(plan.time_band)
    published = error_band("time", plan.config, plan.hardware.arch)
    return (
        "no error band: priced from figures calibrate marked as noise (calibrate --force); "
        f"cluster.profile=none prices from published figures, {band_text(published)}"
    )


VERDICT_TEXT = {
    "fits": "[bold green]fits[/]",
    "tight": "[bold yellow]tight[/] (over the headroom; allocated within the GPU's memory)",
    "does_not_fit": "[bold red]does not fit[/]",
}


DETAIL_HINT = (
    "more: --detail (memory by bucket and pipeline stage, the schedule timeline, "
    "collectives, totals, assumptions)"
)


def plan_headline(plan: Plan) -> str:
    """The plan in one sentence (`run --dry-run`, `submit --dry-run`): verdict, memory of the
    heaviest rank, step time, throughput and MFU."""
    mem, t = plan.memory, plan.time
    verdict = VERDICT_WORDS[mem.verdict]
    return (
        f"[bold]plan[/]: {verdict}, {_gib(mem.heaviest.device_total)} of {_gib(mem.capacity)} "
        f"per device (stage {mem.heaviest.stage}, {mem.headroom:.0%} headroom); step "
        f"{_dur(t.step_s)}, {t.tokens_per_s:,.0f} tokens/s, MFU {t.mfu:.1%} "
        f"(backend={plan.config.backend.name}; `llmtrain plan` for the rest)"
    )


def render_plan(plan: Plan, console: Console, detail: bool = False) -> None:
    """The answer first, in about 25 lines at 80 columns: the verdict, the smallest changes that
    fit when it does not, memory, time, throughput, cost. `detail` adds the tables behind it."""
    _print_summary_panel(plan, console)
    if not plan.memory.fits:
        _print_fixes(plan, console)
    _print_memory_bar(plan, console)
    _print_headline_figures(plan, console)
    if not detail:
        console.print(f"[dim]{DETAIL_HINT}[/]")
        return
    _print_memory_table(plan, console)
    _print_stage_table(plan, console)
    _render_timeline(plan, console)
    _print_time_table(plan, console)
    _print_collectives_table(plan, console)
    _print_totals_table(plan, console)
    console.print("[dim]Assumptions:[/]")
    for a in plan.assumptions:
        console.print(f"[dim]- {a}[/]")


def preference_summary(plan: Plan) -> str | None:
    """finetune.objective=dpo|simpo|orpo: the pairs and the reference (plan/preference.py)."""
    cfg = plan.config
    before = plan.time.compute_s  # includes the reference's forward: take it back out
    ref = reference_forward_s(cfg, 1.0, plan.flops.executed)
    return pairs_summary(cfg, before * ref / (1.0 + ref) if ref else 0.0)


def _print_summary_panel(plan: Plan, console: Console) -> None:
    """The boxed verdict: model, GPUs, backend, fine-tuning, heaviest rank, layout, engine."""
    from rich.panel import Panel

    mem = plan.memory
    h = mem.heaviest
    lay = plan.layout
    verdict = VERDICT_TEXT[mem.verdict]
    console.print(
        Panel(
            f"{plan.config.model.name} on {lay.world_size} x {plan.hardware.name}, "
            f"backend={plan.config.backend.name}\n"
            + (f"{tuned}\n" if (tuned := finetune_summary(plan.config)) else "")
            + (f"{pairs}\n" if (pairs := preference_summary(plan)) else "")
            + f"{verdict}: heaviest rank (stage {h.stage}) {_gib(h.device_total)} of "
            f"{_gib(mem.capacity)}, {mem.headroom:.0%} headroom kept\n"
            f"tp={lay.tp} pp={lay.pp} vpp={lay.vpp} cp={lay.cp} ep={lay.ep} dp={lay.dp}  "
            f"mbs={lay.micro_batch_size} gbs={lay.global_batch_size} accum={lay.grad_accum}\n"
            f"engine: {engine_choices(plan.config).summary()}",
            title="llmtrain plan",
        )
    )


def _print_fixes(plan: Plan, console: Console) -> None:
    """The smallest changes that fit (at most five), or what was tried when none does."""
    console.print("[bold]Smallest changes that fit[/] (device GiB, step time), fastest first:")
    for f in plan.fixes[:5]:
        console.print(f"  {f.line} -> {f.device_bytes / GIB:.1f}{fix_cost(plan, f)}")
    if not plan.fixes:
        console.print(
            "  none found among zero (stages, offload, its group options), recompute, "
            "micro-batch, tp, pp, the torch engine's memory savers (precision=bf16-pure, "
            "optim.name=adamw8bit, optim.state_dtype=bf16, optim.in_backward, optim.offload, "
            "train.activation_offload) and up to three of them together that validate accepts"
        )


def fix_cost(plan: Plan, fix: Fix) -> str:
    """A fix's step time and what it costs in speed: the change in time per token (the step's
    own change while the global batch stays), and the global batch where the fix changes it."""
    if not fix.step_s or not fix.tokens_per_s or not plan.time.tokens_per_s:
        return ""
    slower = plan.time.tokens_per_s / fix.tokens_per_s - 1
    if fix.global_batch_size == plan.layout.global_batch_size:
        return f", step {_dur(fix.step_s)} ({slower:+.0%})"
    return (
        f", step {_dur(fix.step_s)} for a global batch of {fix.global_batch_size} "
        f"({slower:+.0%} a token)"
    )


def _print_memory_bar(plan: Plan, console: Console) -> None:
    """The heaviest rank's buckets as a stacked bar against capacity, the usable limit marked
    under it, and the bar's legend."""
    from rich.text import Text

    mem = plan.memory
    h = mem.heaviest
    width = max(20, min(100, console.width - 10))
    scale = max(mem.capacity, h.device_total)
    bar = Text()
    used = 0
    # Without colour (NO_COLOR) each bucket is drawn with its initial instead of a coloured block.
    plain = console.no_color or console.color_system is None
    for (name, colour), value in zip(BUCKETS, _bucket_values(plan), strict=True):
        cells = round(max(0.0, value) / scale * width)
        bar.append((GLYPHS[name] if plain else "█") * cells, style=colour)
        used += cells
    limit_cell = round(mem.usable / scale * width)
    bar.append("░" * max(0, round(mem.capacity / scale * width) - used), style="grey23")
    console.print(Text("memory ", style="bold") + bar)
    at = 7 + min(limit_cell, width)
    label = "^ capacity - headroom"
    if at + len(label) > console.width:  # the label to the left of the caret, on one line
        label = "capacity - headroom ^"
        at = max(0, at - len(label) + 1)
    marker = Text(" " * at + label)
    console.print(marker, style="dim")
    items = []
    for (name, colour), value in zip(BUCKETS, _bucket_values(plan), strict=True):
        item = Text(f"{GLYPHS[name]} " if plain else "■ ", style=colour)
        items.append(item + Text(f"{name} {value / GIB:.1f}"))
    _print_legend(console, items)
    for note in plan.savers:  # the memory savers in force, each named
        console.print(f"[dim]saver:[/] {note}")
    if plan.priced_length is not None:  # data.packing=false: the length a micro-batch costs
        console.print(f"[dim]batches:[/] {plan.priced_length}", markup=True, highlight=False)
    console.print(build_line(plan.config, plan.layout, h), style="dim")


def _print_headline_figures(plan: Plan, console: Console) -> None:
    """Peak memory, host memory (offload), step time and its parts, where the prices come from,
    throughput, and the whole training's time, cost and checkpoint cadence."""
    h = plan.memory.heaviest
    t = plan.time
    tot = plan.totals
    console.print(
        f"[bold]peak[/] allocated {_gib(h.allocated)}, reserved {_gib(h.reserved)} (torch), "
        f"device {_gib(h.device_total)}; {band_text(plan.memory_band)}"
    )
    if h.host_bytes:
        console.print(
            f"[bold]host[/] (offload) {_gib(h.host_bytes)} per GPU, "
            f"{_gib(h.host_bytes * plan.hardware.gpus_per_node)} per node"
        )
    console.print(
        f"[bold]step[/] {_dur(t.step_s)}, {time_band_text(plan)}: compute "
        f"{_dur(t.compute_s)}, bubble {_dur(t.bubble_s)} ({t.bubble_fraction:.1%}), exposed "
        f"communication {_dur(t.exposed_comm_s)}, optimizer {_dur(t.optimizer_s)}"
    )
    console.print(f"[dim]{pricing_line(plan.profile)}[/]")
    console.print(
        f"[bold]throughput[/] {t.tokens_per_s:,.0f} tokens/s ({t.tokens_per_s_per_gpu:,.0f} per "
        f"GPU), {t.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {t.mfu:.1%}, HFU {t.hfu:.1%}"
    )
    console.print(
        f"[bold]training[/] {tot.steps:,} steps in {_dur(tot.train_s)}, "
        f"{tot.gpu_hours:,.0f} GPU-hours, ${tot.cost_usd:,.0f}; checkpoint "
        f"{tot.checkpoint_bytes / 1e9:,.1f} GB every {_dur(tot.checkpoint_interval_s)} "
        "(Young/Daly)"
    )
    if (budget := budget_note(plan.config, tot.steps)) is not None:  # train.epochs
        console.print(f"[dim]budget:[/] {budget}", markup=True, highlight=False)


def _print_memory_table(plan: Plan, console: Console) -> None:
    """The heaviest rank's memory by bucket, with torch's and the device's totals (--detail)."""
    from rich.table import Table

    mem = plan.memory
    h = mem.heaviest
    table = Table(title=f"Memory per GPU, stage {h.stage} (heaviest)")
    table.add_column("bucket")
    table.add_column("GiB", justify="right")
    for (name, _), value in zip(BUCKETS, _bucket_values(plan), strict=True):
        table.add_row(name, f"{value / GIB:.2f}")
    if h.not_coexisting:
        # plan/memory/grad_liveness.py: gradients made during the backward as activations are freed.
        table.add_row("never live together", f"{-h.not_coexisting / GIB:.2f}")
    table.add_row("allocated (torch)", f"{h.allocated / GIB:.2f}")
    table.add_row("reserved (torch)", f"{h.reserved / GIB:.2f}")
    table.add_row("device total", f"{h.device_total / GIB:.2f}")
    table.add_row("capacity", f"{mem.capacity / GIB:.2f}")
    if h.host_bytes:
        table.add_row("host (offload) per GPU", f"{h.host_bytes / GIB:.2f}")
        table.add_row("host per node", f"{h.host_bytes * plan.hardware.gpus_per_node / GIB:.2f}")
    console.print(table)


def _print_stage_table(plan: Plan, console: Console) -> None:
    """Memory per pipeline stage (--detail, with more than one stage)."""
    from rich.table import Table

    stages = plan.memory.stages
    if len(stages) <= 1:
        return
    st = Table(title="Per pipeline stage")
    for col in ("stage", "layers", "in flight", "allocated GiB", "device GiB"):
        st.add_column(col, justify="right")
    for s in stages:
        st.add_row(
            str(s.stage),
            str(s.layers),
            str(s.in_flight),
            f"{s.allocated / GIB:.1f}",
            f"{s.device_total / GIB:.1f}",
        )
    console.print(st)


def _print_time_table(plan: Plan, console: Console) -> None:
    """The step time's parts, throughput, MFU/HFU and FLOPs per token (--detail)."""
    from rich.table import Table

    t = plan.time
    tt = Table(title="Time per step")
    tt.add_column("quantity")
    tt.add_column("value", justify="right")
    tt.add_row("step", _dur(t.step_s))
    tt.add_row("compute (heaviest stage)", _dur(t.compute_s))
    tt.add_row("pipeline bubble", f"{_dur(t.bubble_s)} ({t.bubble_fraction:.1%})")
    tt.add_row("exposed communication", _dur(t.exposed_comm_s))
    tt.add_row("optimizer step", _dur(t.optimizer_s))
    tt.add_row("tokens/s (global)", f"{t.tokens_per_s:,.0f}")
    tt.add_row("tokens/s per GPU", f"{t.tokens_per_s_per_gpu:,.0f}")
    tt.add_row("model TFLOP/s per GPU", f"{t.tflops_per_gpu:.1f}")
    tt.add_row("MFU (model FLOPs / peak)", f"{t.mfu:.1%}")
    tt.add_row("HFU (hardware FLOPs / peak)", f"{t.hfu:.1%}")
    tt.add_row(
        "FLOPs/token model | hardware", f"{plan.flops.model:.3g} | {plan.flops.hardware:.3g}"
    )
    console.print(tt)


def _print_collectives_table(plan: Plan, console: Console) -> None:
    """Each collective of a step on the heaviest stage, hidden or exposed (--detail)."""
    from rich.table import Table

    collectives = plan.time.collectives
    if not collectives:
        return
    ct = Table(title="Collectives per step (heaviest stage)")
    for col in ("collective", "group", "size", "message", "calls", "GB/s", "time", "exposed"):
        ct.add_column(col, justify="right" if col not in ("collective", "group") else "left")
    for c in collectives:
        ct.add_row(
            c.name,
            c.group,
            str(c.group_size),
            f"{c.message_bytes / 1e6:,.1f} MB",
            str(c.calls_per_step),
            f"{c.bus_gbps:g}",
            _dur(c.time_s),
            "hidden" if c.hidden else _dur(c.exposed_s),
        )
    console.print(ct)


def _print_totals_table(plan: Plan, console: Console) -> None:
    """The whole training: steps, time, GPU-hours, cost, checkpoints and failures (--detail)."""
    from rich.table import Table

    tot = plan.totals
    to = Table(title="Totals")
    to.add_column("quantity")
    to.add_column("value", justify="right")
    to.add_row("steps", f"{tot.steps:,}")
    to.add_row("train time", _dur(tot.train_s))
    to.add_row("GPU-hours", f"{tot.gpu_hours:,.0f}")
    to.add_row("cost", f"${tot.cost_usd:,.0f} at ${tot.price_per_gpu_hour:.2f}/GPU-h")
    to.add_row("checkpoint size", f"{tot.checkpoint_bytes / 1e9:,.1f} GB")
    to.add_row("checkpoint write", _dur(tot.checkpoint_write_s))
    to.add_row("job MTBF", _dur(tot.mtbf_s))
    to.add_row("expected interruptions", f"{tot.expected_interruptions:.1f}")
    to.add_row("checkpoint every (Young/Daly)", _dur(tot.checkpoint_interval_s))
    to.add_row("expected time lost", f"{tot.lost_fraction:.1%}")
    to.add_row("expected wall time", _dur(tot.expected_wall_s))
    console.print(to)


def _print_legend(console: Console, items: list[Any]) -> None:
    """Legend items two spaces apart, wrapped between items only (an item is never split)."""
    from rich.text import Text

    line = Text()
    for item in items:
        if line.plain and len(line.plain) + 2 + len(item.plain) > console.width:
            console.print(line, no_wrap=True, overflow="ignore")
            line = Text()
        line += Text("  ") + item if line.plain else item
    if line.plain:
        console.print(line, no_wrap=True, overflow="ignore")


def _render_timeline(plan: Plan, console: Console) -> None:
    from rich.text import Text

    lay = plan.layout
    if lay.pp <= 1:
        return
    shown = min(lay.grad_accum, 2 * lay.pp)
    schedule = plan.config.parallel.pp_schedule
    interleaved = schedule == "interleaved" and lay.vpp > 1 and shown >= lay.pp
    if interleaved:
        shown -= shown % lay.pp  # Megatron-LM's interleaving runs groups of pp micro-batches
    slots = timeline(
        "gpipe" if schedule == "gpipe" else "interleaved" if interleaved else "1f1b",
        lay.pp,
        shown,
        vpp=lay.vpp if interleaved else 1,
    )
    end = max(s.end for s in slots)
    width = max(30, min(110, console.width - 12))
    scale = width / end
    rows = min(lay.pp, 16)
    title = f"Pipeline schedule ({schedule}"
    if schedule == "interleaved":
        title += f", {lay.vpp} chunks per stage" if interleaved else ", drawn as 1F1B"
    title += f"): {shown} of {lay.grad_accum} micro-batches"
    if rows < lay.pp:
        title += f", first {rows} of {lay.pp} stages"
    console.print(Text(title, style="bold"))
    for stage in range(rows):
        cells = ["·"] * width
        styles = ["grey35"] * width
        for s in slots:
            if s.stage != stage:
                continue
            a = round(s.start * scale)
            b = max(a + 1, round(s.end * scale))
            for i in range(a, min(b, width)):
                # Forward: the micro-batch's digit; backward: its letter (a = 0): told apart
                # without colour too.
                digit = s.microbatch % 10
                cells[i] = str(digit) if s.kind == "F" else "abcdefghij"[digit]
                styles[i] = "bold white on blue" if s.kind == "F" else "bold white on green"
        text = Text(f"stage {stage:>2} ")
        for ch, st in zip(cells, styles, strict=True):
            text.append(ch, style=st)
        console.print(text)
    _print_legend(
        console,
        [
            Text("0-9", style="bold white on blue") + Text(" forward of micro-batch n (mod 10)"),
            Text("a-j", style="bold white on green") + Text(" its backward (a = 0)"),
            Text("·", style="grey35") + Text(" bubble (idle)"),
        ],
    )
