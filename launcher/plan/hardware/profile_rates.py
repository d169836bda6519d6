"""A profile's figures in the planner's hands: ``Rates``, the lookups the planner prices from.

``rates(doc, dtype, threads)`` keeps the figures of a validated profile
(``launcher.plan.hardware.profile`` reads and checks the file) measured in one compute dtype with
one thread count, in hashable form (the planner's memoisation keys hold it); each lookup returns
None when nothing of its class was measured, and the planner keeps the catalog's price there.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig


def layout_family(cfg: LLMTrainConfig, layout: Layout) -> str:
    """What a step's overhead depends on besides its size: the backend, the parallel degrees and
    the ZeRO stage, e.g. "torch dp2 tp1 pp1 cp1 ep1 zero0" (the key of a profile's "overhead"
    entries, launch/step_overhead.py)."""
    return (
        f"{cfg.backend.name} dp{layout.dp} tp{layout.tp} pp{layout.pp} cp{layout.cp} "
        f"ep{layout.ep} zero{cfg.zero.stage}"
    )


# --- looking measured figures up --------------------------------------------------------------


def overhead_units(layout: Layout, stage_layers: int) -> int:
    """How often a step of this layout synchronises its ranks, in the unit the measured overhead
    scales by (``Rates.overhead_s``): with tensor, context or expert parallelism inside every
    layer on every micro-batch (stage layers x micro-batches); with pipeline stages once per
    micro-batch; with data parallelism (ZeRO included) and a single process once per step. Where
    the ranks meet is where one waits for the other and where the engine's dispatch runs, so the
    overhead measured on a cut run (launch/step_overhead.py) counts per such meeting.

    e.g. tp=2, 4 layers, 2 micro-batches: 8; pp=2, 4 micro-batches: 4; dp=2: 1.
    """
    mb = max(1, layout.num_microbatches)
    if layout.tp > 1 or layout.cp > 1 or layout.ep > 1:
        return max(1, stage_layers) * mb
    if layout.pp > 1:
        return mb
    return 1


def _log_distance(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return sum(
        abs(math.log(max(1.0, x)) - math.log(max(1.0, y))) for x, y in zip(a, b, strict=True)
    )


@dataclass(frozen=True)
class Rates:
    """A profile's figures for one dtype and thread count, in hashable form (the planner's
    memoisation keys hold it). Every lookup returns None when nothing of its class was measured."""

    dtype: str
    threads: int
    gemms: tuple[tuple[int, int, int, float, float], ...]  # m, n, k, fwd_s, bwd_s
    attention: tuple[tuple[str, int, int, int, int, int, float, float], ...]
    elementwise: tuple[tuple[int, float, float, float], ...]  # tokens, bytes, fwd_s, bwd_s
    loss: tuple[tuple[float, float, float], ...]  # tokens x vocab, fwd_s, bwd_s
    optimizer: tuple[tuple[float, float], ...]  # params, seconds
    collectives: tuple[tuple[str, int, float, float], ...]  # kind, ranks, bytes, seconds
    # layout family, stage layers x micro-batches, seconds per step (launch/step_overhead.py)
    overheads: tuple[tuple[str, int, float], ...] = ()
    # True: every compute lookup at the fastest rate measured in its class (``optimistic``).
    bound: bool = False

    def optimistic(self) -> Rates:
        """These figures with every compute lookup (GEMM, attention, element-wise, loss) at the
        fastest rate measured in its class, whatever the shape: never slower than the exact
        lookups, and proportional to the work, so a step priced from it at one sequence per
        micro-batch and scaled bounds every larger micro-batch (the layout search's bound,
        search/layouts.py).

        e.g. GEMMs measured at 100 and 400 GFLOP/s forward: every forward GEMM is priced at 400.
        """
        return dataclasses.replace(self, bound=True)

    def gemm(self, m: float, n: float, k: float) -> tuple[float, float, bool] | None:
        """(forward, backward seconds, measured exactly) of one m x n x k GEMM: the measured
        figure for that shape, else the nearest measured shape's (log distance over m, n, k) at
        its FLOP rate.

        e.g. measured 2048 x 128 x 128 in 1.0 ms forward: 2048 x 128 x 256 (twice the FLOPs,
        not measured) is priced 2.0 ms.
        """
        if not self.gemms:
            return None
        if self.bound:
            work = m * n * k
            return (
                work * min(g[3] / (g[0] * g[1] * g[2]) for g in self.gemms),
                work * min(g[4] / (g[0] * g[1] * g[2]) for g in self.gemms),
                False,
            )
        for gm, gn, gk, f, b in self.gemms:
            if (gm, gn, gk) == (round(m), round(n), round(k)):
                return f, b, True
        near = min(self.gemms, key=lambda g: _log_distance((g[0], g[1], g[2]), (m, n, k)))
        scale = (m * n * k) / (near[0] * near[1] * near[2])
        return near[3] * scale, near[4] * scale, False

    def attention_s(
        self, kind: str, batch: int, heads: int, kv_heads: int, seq: int, head_dim: int
    ) -> tuple[float, float, bool] | None:
        """(forward, backward, exact) of the attention core; other shapes scale by the FLOPs of
        the nearest measured one (batch x heads x seq^2 x head_dim)."""
        same = [a for a in self.attention if a[0] == kind] or list(self.attention)
        if not same:
            return None
        if self.bound:
            work = batch * heads * seq * seq * head_dim
            per = [a[1] * a[2] * a[4] ** 2 * a[5] for a in same]
            return (
                work * min(a[6] / w for a, w in zip(same, per, strict=True)),
                work * min(a[7] / w for a, w in zip(same, per, strict=True)),
                False,
            )
        for a in same:
            if a[1:6] == (batch, heads, kv_heads, seq, head_dim) and a[0] == kind:
                return a[6], a[7], True
        near = min(same, key=lambda a: _log_distance((a[4], a[5], a[2]), (seq, head_dim, heads)))
        scale = (batch * heads * seq * seq * head_dim) / (
            near[1] * near[2] * near[4] ** 2 * near[5]
        )
        return near[6] * scale, near[7] * scale, False

    def elementwise_per_byte(self, nbytes: float) -> tuple[float, float] | None:
        """(forward, backward) seconds per forward byte of element-wise work, from the measured
        layer nearest in size."""
        if not self.elementwise:
            return None
        if self.bound:
            return (
                min(e[2] / e[1] for e in self.elementwise),
                min(e[3] / e[1] for e in self.elementwise),
            )
        near = min(self.elementwise, key=lambda e: abs(math.log(e[1] / max(1.0, nbytes))))
        return near[2] / near[1], near[3] / near[1]

    def loss_s(self, tokens: float, vocab: float) -> tuple[float, float] | None:
        """(forward, backward) of the loss (and embedding lookup), scaled by tokens x vocab."""
        if not self.loss:
            return None
        size = tokens * vocab
        if self.bound:
            return size * min(e[1] / e[0] for e in self.loss), size * min(
                e[2] / e[0] for e in self.loss
            )
        near = min(self.loss, key=lambda e: abs(math.log(e[0] / max(1.0, size))))
        return near[1] * size / near[0], near[2] * size / near[0]

    def optimizer_s(self, params: float) -> float | None:
        """Seconds of one optimizer step (with gradient clipping and zero_grad) on `params`
        parameters: the line (fixed cost + cost per parameter, least squares) through the sizes
        measured; with one size only, its seconds per parameter.

        e.g. measured 10 ms on 1e9 and 4 ms on 2.5e8 parameters: 2 ms fixed + 8 ms per 1e9, so
        2e9 parameters are priced 18 ms (proportional scaling from 2.5e8 would say 32 ms).
        """
        if not self.optimizer or params <= 0:
            return None
        return _line(list(self.optimizer), params)

    def collective_s(self, kind: str, ranks: int, nbytes: float) -> float | None:
        """Seconds of one collective: latency + bytes / bandwidth fitted (least squares) to the
        sizes measured for this kind and group size; None when none was."""
        rows = [(b, s) for k, r, b, s in self.collectives if k == kind and r == ranks]
        if not rows:
            return None
        return _line(rows, nbytes)

    def overhead_s(self, family: str, units: int) -> float | None:
        """Seconds a step of a layout of `family` costs beyond the planner's terms at `units`
        synchronisations (``overhead_units``): the line (fixed part + part per synchronisation,
        least squares, both >= 0) through the cut runs measured (launch/step_overhead.py); runs
        at one number of synchronisations only: their mean, whatever `units`; None when no run
        of this family was measured.

        e.g. measured 6 ms at 4 units and 10 ms at 8 (tp=2: 1 layer x 4 and 8 micro-batches):
        2 ms + 1 ms per unit, so 16 units are priced 18 ms.
        """
        rows = [(float(u), s) for f, u, s in self.overheads if f == family]
        if not rows:
            return None
        if len({u for u, _ in rows}) == 1:
            return sum(s for _, s in rows) / len(rows)
        return _line(rows, float(units))


def _line(rows: list[tuple[float, float]], x: float) -> float:
    """y at x of the least-squares line (intercept >= 0, slope >= 0) through (x, y) rows; one
    row: y proportional to x."""
    if len(rows) == 1:
        return rows[0][1] * x / rows[0][0]
    n = len(rows)
    mx = sum(b for b, _ in rows) / n
    my = sum(s for _, s in rows) / n
    var = sum((b - mx) ** 2 for b, _ in rows)
    slope = sum((b - mx) * (s - my) for b, s in rows) / var if var > 0 else 0.0
    slope = max(0.0, slope)
    alpha = max(0.0, my - slope * mx)
    return alpha + slope * x


def rates(doc: dict[str, Any], dtype: str, threads: int) -> Rates:
    def ok(e: dict[str, Any], with_dtype: bool = True) -> bool:
        return (not with_dtype or e.get("dtype") == dtype) and int(e.get("threads", 0)) == threads

    return Rates(
        dtype=dtype,
        threads=threads,
        gemms=tuple(
            sorted(
                (int(e["m"]), int(e["n"]), int(e["k"]), float(e["fwd_s"]), float(e["bwd_s"]))
                for e in doc.get("gemm", [])
                if ok(e)
            )
        ),
        attention=tuple(
            sorted(
                (
                    str(e.get("kind", "flash")),
                    int(e["batch"]),
                    int(e["heads"]),
                    int(e.get("kv_heads", e["heads"])),
                    int(e["seq"]),
                    int(e["head_dim"]),
                    float(e["fwd_s"]),
                    float(e["bwd_s"]),
                )
                for e in doc.get("attention", [])
                if ok(e)
            )
        ),
        elementwise=tuple(
            sorted(
                (int(e["tokens"]), float(e["bytes"]), float(e["fwd_s"]), float(e["bwd_s"]))
                for e in doc.get("elementwise", [])
                if ok(e)
            )
        ),
        loss=tuple(
            sorted(
                (float(e["tokens"]) * float(e["vocab"]), float(e["fwd_s"]), float(e["bwd_s"]))
                for e in doc.get("loss", [])
                if ok(e)
            )
        ),
        optimizer=tuple(
            sorted(
                (float(e["params"]), float(e["seconds"]))
                for e in doc.get("optimizer", [])
                if ok(e, with_dtype=False)
            )
        ),
        collectives=tuple(
            sorted(
                (str(e["kind"]), int(e["ranks"]), float(e["bytes"]), float(e["seconds"]))
                for e in doc.get("collectives", [])
                if ok(e, with_dtype=False)
            )
        ),
        overheads=tuple(
            sorted(
                (str(e["layout"]), int(e["units"]), float(e["seconds"]))
                for e in doc.get("overhead", [])
                if ok(e, with_dtype=False)
            )
        ),
    )


__all__ = ["Rates", "layout_family", "overhead_units", "rates"]
