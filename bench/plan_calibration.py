"""The planner against every published reference run (launcher/plan/calibration/reference_runs.py,
their figures checked against bench/data/calibration.csv): fitted errors (committed constants),
leave-one-source-out cross-validated errors (fit on all sources but one, predict that one), the
newer-from-older errors (fit on earlier engine release years only, predict the next), and how
often the bands `plan` states hold (typical / worst: the 80% / 90% split-conformal levels).

Usage: PYTHONPATH=. .venv/bin/python bench/plan_calibration.py [--write]
  --write  regenerate launcher/plan/calibration/error_bands.py (the bands `plan` prints) from the CV
  errors.
Exits non-zero when the CV median |error| exceeds 10% for time or for memory, or when a
calibration layout (a run that really ran) gets the verdict "does not fit".
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plan_fit import Prepared, fit, log_errors, prepare, table_from
from bench.reference_data import checked_points
from launcher.plan.calibration.bands import key_levels, label, regime_keys
from launcher.plan.planner import make_plan

BAR = 0.10
BANDS_FILE = (
    Path(__file__).resolve().parent.parent / "launcher" / "plan" / "calibration" / "error_bands.py"
)


def metric_of(r: Prepared) -> str:
    return "time" if r.point.metric == "step_s" else "memory"


def cross_validate(rows: list[Prepared]) -> dict[int, float]:
    """Row index -> log error when its source was left out of the fit."""
    out: dict[int, float] = {}
    for source in sorted({r.point.source for r in rows}):
        train = [r for r in rows if r.point.source != source]
        test_idx = [i for i, r in enumerate(rows) if r.point.source == source]
        shared, fam = fit(train)
        errs = log_errors([rows[i] for i in test_idx], table_from(shared, fam))
        out.update(zip(test_idx, errs, strict=True))
    return out


# Software generations: the year of the engine release each source ran
# (launcher/plan/calibration/reference_runs.py and bench/data/calibration.csv name them):
# Megatron-LM of Narayanan et al. 2021 (N); the Megatron-LM of PR #482, 2023-09 (P482) and
# llm-foundry's MPT benchmarks, 2023 (MP); NeMo 24.03.01 (NL), NeMo 24.07 (NP), torchtitan of
# 2024-12 (T); NeMo 25.02 (NB), NeMo AutoModel (AM) and torchao's mxfp8 (AO), 2025. A user plans for
# the newest release with constants fitted on older ones: `forward_chain` fits on every release
# before a year and predicts that year.
RELEASE_YEAR = {
    "N": 2021,
    "P482": 2023,
    "MP": 2023,
    "NL": 2024,
    "NP": 2024,
    "T": 2024,
    "NB": 2025,
    "AM": 2025,
    "AO": 2025,
}


def forward_chain(rows: list[Prepared]) -> dict[int, float]:
    """Row index -> log error when fitted only on the sources of earlier release years."""
    out: dict[int, float] = {}
    years = sorted({RELEASE_YEAR[r.point.source] for r in rows})
    for year in years[1:]:
        train = [r for r in rows if RELEASE_YEAR[r.point.source] < year]
        test_idx = [i for i, r in enumerate(rows) if RELEASE_YEAR[r.point.source] == year]
        shared, fam = fit(train)
        errs = log_errors([rows[i] for i in test_idx], table_from(shared, fam))
        out.update(zip(test_idx, errs, strict=True))
    return out


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return math.nan
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(len(v) - 1, lo + 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _up(x: float) -> float:
    """Round up to 0.1% (a band never understates what was measured)."""
    return math.ceil(x * 1000.0) / 1000.0


# The stated band must hold on new layouts: "typical" for at least half of them (we state the
# 80% level), "worst" for at least 90%. With n exchangeable errors, a new one exceeds the k-th
# smallest with probability at most 1 - k / (n + 1) (split-conformal prediction, Vovk et al.
# 2005; Angelopoulos & Bates 2021, section 1): the level-c band is the ceil(c (n + 1))-th
# smallest error. A regime with too few rows for that (worst: n < 9; typical: n < 4) takes its
# errors pooled with the next coarser regime's (bands.key_levels), until there are enough; the
# band is never below the regime's own largest error. Nothing is fitted: order statistics.
TYPICAL_COVER = 0.8
WORST_COVER = 0.9


def conformal(errors: list[float], cover: float) -> float | None:
    """The ceil(cover (n + 1))-th smallest of `errors`, None when n is too small for `cover`."""
    v = sorted(errors)
    k = math.ceil(cover * (len(v) + 1))
    return v[k - 1] if 0 < k <= len(v) else None


def pooled(per: dict[str, list[float]], key: str, cover: float) -> float:
    """The level-`cover` band of `key`, pooling coarser regimes' rows while it has too few."""
    own = per[key]
    for level in dict.fromkeys([key, *key_levels(*key.split("|"))]):
        if level not in per:
            continue
        q = conformal(per[level], cover)
        if q is not None:
            return max(q, max(own) if cover == WORST_COVER else q)
    return max(max(v) for v in per.values())


def bands(
    rows: list[Prepared], cv: dict[int, float], fitted_errs: list[float]
) -> dict[str, dict[str, tuple[float, float, int]]]:
    """Per regime: the typical (80%) and worst (90%) conformal bands of each row's larger |error|
    (cross-validated or with the committed constants), pooled where a regime has few rows."""
    table: dict[str, dict[str, list[float]]] = {"time": {}, "memory": {}}
    for i, r in enumerate(rows):
        if not r.point.scored:
            continue
        err = max(abs(math.expm1(cv[i])), abs(math.expm1(fitted_errs[i])))
        for key in key_levels(*regime_keys(r.point.config, r.family)):
            table[metric_of(r)].setdefault(key, []).append(err)
    out: dict[str, dict[str, tuple[float, float, int]]] = {}
    for metric, per in table.items():
        out[metric] = {}
        for key in sorted(per):
            worst = pooled(per, key, WORST_COVER)
            typical = min(pooled(per, key, TYPICAL_COVER), worst)
            out[metric][key] = (_up(typical), _up(worst), len(per[key]))
    return out


Table = dict[str, dict[str, tuple[float, float, int]]]


def coverage(
    rows: list[Prepared], cv: dict[int, float], table: Table
) -> dict[str, tuple[int, int, int]]:
    """Per metric: (rows, within typical, within worst) of the leave-one-source-out errors against
    the band each row's own regime states (bands.error_band's lookup)."""
    from launcher.plan.calibration.bands import MIN_ROWS

    out: dict[str, tuple[int, int, int]] = {}
    for metric in ("time", "memory"):
        n = typ = wor = 0
        for i, r in enumerate(rows):
            if not r.point.scored or metric_of(r) != metric:
                continue
            keys = key_levels(*regime_keys(r.point.config, r.family))
            known = [k for k in keys if k in table[metric] and table[metric][k][2] >= MIN_ROWS]
            key = known[0] if known else "*|*|*|*"
            t, w, _ = table[metric][key]
            e = abs(math.expm1(cv[i]))
            n += 1
            typ += e <= t + 1e-12
            wor += e <= w + 1e-12
        out[metric] = (n, typ, wor)
    return out


def write_bands(data: dict[str, dict[str, tuple[float, float, int]]]) -> None:
    lines = [
        '"""Generated by bench/plan_calibration.py --write: do not edit by hand.',
        "",
        "|error| of the planner by regime under leave-one-source-out cross-validation on",
        'bench/data/calibration.csv: key "kind|precision|family|context" -> (typical, worst,',
        "rows): the 80% and 90% split-conformal levels, pooled with coarser regimes where a",
        "regime has few rows (bench/plan_calibration.py bands).",
        '"""',
        "",
        "BANDS: dict[str, dict[str, tuple[float, float, int]]] = {",
    ]
    for metric, per in data.items():
        lines.append(f'    "{metric}": {{')
        for key, (typ, worst, n) in per.items():
            lines.append(f'        "{key}": ({typ}, {worst}, {n}),')
        lines.append("    },")
    lines.append("}")
    BANDS_FILE.write_text("\n".join(lines) + "\n", encoding="utf-8")


def summary(name: str, errs: list[float]) -> str:
    a = [abs(e) for e in errs]
    return f"{name:<34} n={len(a):>2}  median {statistics.median(a):6.1%}  worst {max(a):6.1%}"


def main() -> int:
    rows = prepare(checked_points())
    fitted_errs = log_errors(rows, None)
    cv = cross_validate(rows)
    head = f"{'id':<9} {'src':<5} {'metric':<9} {'predicted':>10} {'measured':>10}"
    print(f"{head} {'fitted':>8} {'CV':>8}")
    for i, r in enumerate(rows):
        p = r.point
        unit = 1.0 if p.metric == "step_s" else 2**30
        pred = p.measured * math.exp(fitted_errs[i])
        mark = "" if p.scored else "  (not scored: " + p.note + ")"
        left = f"{p.id:<9} {p.source:<5} {metric_of(r):<9} {pred / unit:>10.4g}"
        print(
            f"{left} {p.measured / unit:>10.4g} "
            f"{math.expm1(fitted_errs[i]):>+8.1%} {math.expm1(cv[i]):>+8.1%}{mark}"
        )
    scored = [i for i, r in enumerate(rows) if r.point.scored]
    ok = True
    for metric in ("time", "memory"):
        idx = [i for i in scored if metric_of(rows[i]) == metric]
        print()
        print(summary(f"{metric}: fitted, all rows", [math.expm1(fitted_errs[i]) for i in idx]))
        cv_errs = [math.expm1(cv[i]) for i in idx]
        print(summary(f"{metric}: leave-one-source-out, all", cv_errs))
        groups: dict[str, list[int]] = {}
        for i in idx:
            kind, prec, fam, ctx = regime_keys(rows[i].point.config, rows[i].family)
            groups.setdefault(label(f"{kind}|{prec}|{fam}|{ctx}"), []).append(i)
            groups.setdefault("source " + rows[i].point.source, []).append(i)
        for name in sorted(groups):
            g = groups[name]
            fit_med = statistics.median(abs(math.expm1(fitted_errs[i])) for i in g)
            print(
                summary(f"  {name}", [math.expm1(cv[i]) for i in g])
                + f"   (fitted median {fit_med:.1%})"
            )
        med = statistics.median(abs(e) for e in cv_errs)
        if med > BAR:
            ok = False
            print(f"FAIL: {metric} CV median |error| {med:.1%} > {BAR:.0%}")
    chained = forward_chain(rows)
    print("\nnewer from older (fitted on earlier release years only; |error| median / worst):")
    for year in sorted({RELEASE_YEAR[r.point.source] for r in rows}):
        for metric in ("time", "memory"):
            g = [
                i
                for i in chained
                if rows[i].point.scored
                and metric_of(rows[i]) == metric
                and RELEASE_YEAR[rows[i].point.source] == year
            ]
            if g:
                srcs = " ".join(sorted({rows[i].point.source for i in g}))
                print(summary(f"  {year} {metric} ({srcs})", [math.expm1(chained[i]) for i in g]))
    refused = [
        r.point.id
        for r in rows
        if r.point.scored and make_plan(r.point.config).memory.verdict == "does_not_fit"
    ]
    ids = sorted(set(refused))
    print(f"\ncalibration layouts called 'does not fit': {len(ids)} {' '.join(ids)}")
    if ids:
        ok = False
    table = bands(rows, cv, fitted_errs)
    for metric, (n, typ, wor) in coverage(rows, cv, table).items():
        print(
            f"{metric}: the stated band holds on {typ}/{n} rows (typical) and {wor}/{n} (worst), "
            "leave-one-source-out"
        )
    if "--write" in sys.argv:
        write_bands(table)
        print(f"wrote {BANDS_FILE}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
