"""The "What each backend runs" table of docs/backends.md, generated from the backend tables.

``python -m launcher.backends.table`` prints it; tests/unit/backends/test_backends_readme.py asserts
that docs/backends.md holds exactly this text between its markers.
"""

from __future__ import annotations

from launcher.backends.common import DEGREE_WORDS, DEGREES, FEATURES, all_backends

START = "<!-- backends-table:start (generated: python -m launcher.backends.table) -->"
END = "<!-- backends-table:end -->"


# launcher/plan/recompute.py's modes, as the table says them.
_RECOMPUTE_WORDS = {"op": "op-level selective checkpointing", "core": "attention core"}


def _stages(stages: tuple[int, ...]) -> str:
    return ", ".join(str(s) for s in stages) if stages else "no"


def markdown_table() -> str:
    backends = list(all_backends().values())
    rows: list[tuple[str, list[str]]] = [
        (
            "`run` / `submit` here",
            [
                (f"yes, with {b.needs}" if b.needs else "yes")
                if b.launchable
                else f"no: plan/render only (needs {b.needs})"
                for b in backends
            ],
        ),
        ("devices", [", ".join(b.devices) for b in backends]),
    ]
    for key in DEGREES:
        rows.append(
            (
                f"{DEGREE_WORDS[key]} (`parallel.{key}` > 1)",
                ["yes" if key in b.degrees else "no" for b in backends],
            )
        )
    rows += [
        (
            "expert groups drawn from",
            [" x ".join(b.expert_span) if "ep" in b.degrees else "-" for b in backends],
        ),
        ("`zero.stage`", [_stages(b.zero_stages) for b in backends]),
        (
            "`zero.offload_optimizer=cpu` with stage",
            [_stages(b.offload_optimizer_stages) for b in backends],
        ),
        (
            "`zero.offload_params=cpu` with stage",
            [_stages(b.offload_params_stages) for b in backends],
        ),
        ("precision", [", ".join(b.precisions) for b in backends]),
        ("`optim.name`", [", ".join(b.optimizers) for b in backends]),
        (
            "`parallel.pp_schedule`",
            [", ".join(b.schedules) if b.schedules else "-" for b in backends],
        ),
        (
            "`backend.moe_dispatcher` (first: the default)",
            [", ".join(b.moe_dispatchers) for b in backends],
        ),
        (
            "`train.recompute=selective` on dense / MoE layers",
            [" / ".join(_RECOMPUTE_WORDS[m] for m in b.selective_recompute) for b in backends],
        ),
        (
            "embedding and output layer under tp",
            ["split over tp" if b.tp_splits_vocab else "whole on every tp rank" for b in backends],
        ),
    ]
    for feature, words in FEATURES.items():
        rows.append((words, ["yes" if b.runs_feature(feature) else "no" for b in backends]))
    rows.append(
        (
            "other refusals",
            [
                ", ".join(c.__name__.strip("_").replace("_", " ") for c in b.combos) or "-"
                for b in backends
            ],
        )
    )
    header = "| | " + " | ".join(f"`backend={b.name}`" for b in backends) + " |"
    rule = "|---|" + "---|" * len(backends)
    lines = [START, header, rule]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]
    lines.append(END)
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
