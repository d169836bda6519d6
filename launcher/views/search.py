"""The layout search as a Rich table and as a stable JSON document (rich is imported here only)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from launcher.plan.memory.estimate import GIB
from launcher.search.layouts import MEMORY, OUTRANKED, Candidate, SearchResult

if TYPE_CHECKING:
    from rich.console import Console


def _candidate_json(c: Candidate) -> dict[str, Any]:
    return {
        "overrides": c.line,  # one shell-quoted string, to paste after `llmtrain run`
        "override_list": list(c.overrides),  # the same as arguments, for scripts (no quoting)
        "backend": c.backend,
        "memory_bytes": int(c.memory_bytes),
        "step_s": c.step_s,
        "tokens_per_s": c.tokens_per_s,
        "mfu": c.mfu,
        "bubble_fraction": c.bubble_fraction,
        "headroom": c.headroom,
        "dp": c.dp,
        "grad_accum": c.grad_accum,
    }


def search_to_json(result: SearchResult) -> dict[str, Any]:
    """Stable keys: evaluated, candidates, rejected, smallest_cluster, elapsed_s (and extras)."""
    return {
        "evaluated": result.evaluated,
        "candidates": [_candidate_json(c) for c in result.candidates],
        "rejected": dict(result.rejected),
        "smallest_cluster": result.smallest_cluster,
        "elapsed_s": result.elapsed_s,
        "space_size": result.space_size,
        "fitting": result.fitting,
        "timed": result.timed,
        "model": result.model,
        "gpu": result.gpu,
        "backends": list(result.backends),
        "num_nodes": result.num_nodes,
        "gpus_per_node": result.gpus_per_node,
        "global_batch_size": result.global_batch_size,
        "min_headroom": result.min_headroom,
        "given": {
            "status": result.given_status,
            "rank": result.given_rank,
            "candidate": _candidate_json(result.given) if result.given else None,
        },
        "notes": list(result.notes),
        "pricing": result.pricing,
    }


def _reason(name: str) -> str:
    if name == MEMORY:
        return "memory: does not fit with the headroom"
    if name == OUTRANKED:
        return "outranked: cannot beat the last row (bound on tokens/s), not evaluated"
    return f"rule {name}"


_SHORT = {
    "backend": "",
    "parallel.tp": "tp",
    "parallel.pp": "pp",
    "parallel.vpp": "vpp",
    "parallel.cp": "cp",
    "parallel.ep": "ep",
    "zero.stage": "zero",
    "train.micro_batch_size": "mbs",
    "train.recompute": "recompute",
    "parallel.pp_schedule": "",
    "parallel.sequence_parallel": "sp",
    "zero.offload_optimizer": "offload",
    # Megatron-Core's uneven pipeline splits (launcher/config/pipeline_split.py).
    "parallel.account_for_embedding_in_pipeline_split": "E-split",
    "parallel.account_for_loss_in_pipeline_split": "L-split",
    "parallel.num_layers_in_first_pipeline_stage": "first",
    "parallel.num_layers_in_last_pipeline_stage": "last",
    "parallel.pipeline_layout": "layout",
}


def _short(overrides: tuple[str, ...]) -> str:
    """'tp8 pp16 vpp4 interleaved zero1 mbs1 recompute=none sp' for the table."""
    parts = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key not in _SHORT or (value in ("null", "false", "none") and key != "train.recompute"):
            continue
        name = _SHORT[key]
        if value == "true":
            parts.append(name)
        elif name in ("recompute", "offload", "first", "last", "layout"):
            parts.append(f"{name}={value}")
        else:
            parts.append(f"{name}{value}")
    return " ".join(parts)


def _differing(overrides: tuple[str, ...], given: dict[str, object] | None) -> str:
    """The overrides that change the configuration as given (backend= always first), so the
    line to copy stays short; all of them when the given values are not known."""
    if given is None:
        return " ".join(shlex.quote(o) for o in overrides)

    def same(item: str) -> bool:
        key, _, value = item.partition("=")
        have = given.get(key)
        text = "null" if have is None else str(have).lower() if isinstance(have, bool) else have
        return str(text) == value

    kept = [o for i, o in enumerate(overrides) if i == 0 or not same(o)]
    return " ".join(shlex.quote(o) for o in kept)  # a layout string is quoted for the shell


def render_search(
    result: SearchResult, console: Console, given_values: dict[str, object] | None = None
) -> None:
    """The top layouts, then why the rest of the space was left out. `given_values`: the
    configuration as composed (dotted keys), so the lines to copy hold only what changes it."""
    from rich.table import Table
    from rich.text import Text

    head = (
        f"{result.model} on {result.world_size} x {result.gpu} "
        f"({result.num_nodes} node{'s' if result.num_nodes != 1 else ''} x "
        f"{result.gpus_per_node}), global batch "
        f"{result.global_batch_size}, headroom {result.min_headroom:.0%}: "
        f"{result.space_size:,} layouts, {result.evaluated:,} evaluated, "
        f"{result.fitting:,} fit ({result.elapsed_s:.2f} s)"
    )
    console.print(Text(head, style="bold"))
    if result.pricing:
        console.print(Text(result.pricing, style="dim"))
    if result.candidates:
        table = Table(title=f"Top {len(result.candidates)} layouts by predicted tokens/s")
        table.add_column("#", justify="right")
        table.add_column("layout")
        table.add_column("memory GiB", justify="right")
        table.add_column("step s", justify="right")
        table.add_column("tokens/s", justify="right")
        table.add_column("MFU", justify="right")
        table.add_column("bubble", justify="right")
        for i, c in enumerate(result.candidates, 1):
            table.add_row(
                str(i),
                _short(c.overrides),
                f"{c.memory_bytes / GIB:.1f}",
                f"{c.step_s:.2f}",
                f"{c.tokens_per_s:,.0f}",
                f"{c.mfu:.1%}",
                f"{c.bubble_fraction:.1%}",
            )
        console.print(table)
        console.print(
            "Override lines to copy (add them to your command):"
            if given_values is not None
            else "Override lines to copy:"
        )
        for i, c in enumerate(result.candidates, 1):
            # Plain text, never wrapped or cut, so it can be pasted as is.
            console.print(Text(f"{i:>3}  {_differing(c.overrides, given_values)}"), soft_wrap=True)
    else:
        console.print(Text("No layout fits.", style="bold red"))
        if result.smallest_cluster is not None:
            console.print(
                f"The smallest cluster on which one fits: cluster.num_nodes="
                f"{result.smallest_cluster} ({result.smallest_cluster * result.gpus_per_node} "
                "GPUs); rerun the search with it."
            )
    for note in result.notes:
        console.print(Text(note, style="yellow"))
    given = f"The configuration as given: {result.given_status}"
    if result.given is not None:
        given += (
            f", {result.given.tokens_per_s:,.0f} tokens/s, "
            f"{result.given.memory_bytes / GIB:.1f} GiB"
        )
    if result.given_rank is not None:
        given += f", rank {result.given_rank}"
    console.print(given)
    if result.rejected:
        rej = Table(title="Left out")
        rej.add_column("reason")
        rej.add_column("layouts", justify="right")
        for name, count in result.rejected.items():
            rej.add_row(_reason(name), f"{count:,}")
        console.print(rej)
