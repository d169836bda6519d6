"""Fuzz the command line with thousands of generated bad overrides and config files.

    python bench/fuzz_cli.py [--cases 3000] [--seed 0] [--subprocess 20] [--templates 0]
        [--headers 0]
    python bench/fuzz_cli.py --only templates --templates 200 [--template-seconds 2]

Uses the strategies of tests/unit/test_fuzz_cli.py (unknown keys, typos, keys under the wrong node,
wrong types, out-of-range values, bad choices, bad group options, malformed overrides, combinations,
bad YAML group files and recipes). Each case runs in this process with one of `validate`, `plan`,
`show`, `run` (through typer's runner on the app, or the console entry point), and optionally a few
in child processes. Prints, per category: cases run, how many exited 2 naming the key, how many were
valid random text (accepted), and every failure with its input. Exit status 1 if any case failed.

`--headers N` also runs N generated safetensors files (tests/unit/test_fuzz_files.py,
``safetensors_bytes``: header lengths, dtypes, shapes and offsets that lie, as a regular file, a
FIFO, a link to /dev/zero, a folder or a sparse file) through `validate train.init_from=`: each
must end within seconds, exit 0 or 2, print no traceback and change no file.

Measured (2-core CPU box): --cases 3000 --seed 1: 3,020 cases (20 in child processes), all exit 2
naming the key, 223 s; --cases 5000 --seed 2: 5,030 cases, all exit 2 naming the key, 385 s.

`--templates N` adds N chat templates drawn from tests/unit/data/test_fuzz_templates.py's grammar
(loops, repetition, widths, powers, padding, namespace doubling, recursion, raise_exception with
escapes), each through `data prepare` as a user runs it: rendered by the template worker (a child
process with its address-space limit and watchdog) under a `--template-seconds` time budget. A
case passes when it exits 0, or 2 naming the records file and line, within the budget and 30 s,
with no traceback, no escape byte, a message under 2,000 characters and no folder left behind.
Measured (the shared 2-core box, loaded): --only templates --templates 100 --seed 1: 100 cases,
all exit 2 naming the records file and line, 67 s.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
# Share of the cases per category (config files and Hydra-level errors cost ~0.15 s each).
WEIGHTS = {
    "unknown-key": 0.12,
    "typo-key": 0.12,
    "wrong-node": 0.08,
    "wrong-type": 0.14,
    "out-of-range": 0.08,
    "bad-choice": 0.08,
    "bad-group-option": 0.08,
    "malformed": 0.14,
    "combination": 0.08,
    "config-file": 0.08,
}


def load_fuzz_module(name: str = "test_fuzz_cli") -> ModuleType:
    sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "unit" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_headers(cases: int, seed_value: int, tally: Tally) -> None:
    """`cases` generated safetensors files through `validate train.init_from=` (module doc)."""
    files = load_fuzz_module("test_fuzz_files")
    check = files.test_safetensors_headers.hypothesis.inner_test

    @seed(seed_value)
    @settings(
        max_examples=cases, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(content=files.safetensors_bytes(), kind=st.sampled_from(files.KINDS))
    def one(content: bytes, kind: str) -> None:
        start = time.perf_counter()
        try:
            check(content=content, kind=kind)
        except AssertionError as exc:
            tally.failed.append(f"[headers] {kind} {content[:80]!r}: {str(exc)[:300]}")
        else:
            tally.named["headers"] += 1
        tally.ran["headers"] += 1
        tally.seconds["headers"] += time.perf_counter() - start

    one()


@dataclass
class Tally:
    ran: Counter[str] = field(default_factory=Counter)
    named: Counter[str] = field(default_factory=Counter)
    valid: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    failed: list[str] = field(default_factory=list)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=3000, help="in-process cases in all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subprocess", type=int, default=20, help="cases in child processes")
    parser.add_argument("--only", help="run one category (templates: only --templates)")
    parser.add_argument("--templates", type=int, default=0, help="chat templates to run")
    parser.add_argument("--template-seconds", type=float, default=2.0)
    parser.add_argument("--headers", type=int, default=0, help="safetensors headers to run")
    args = parser.parse_args()

    fuzz = load_fuzz_module()
    tally = Tally()
    weights = {args.only: 1.0} if args.only else WEIGHTS
    if args.only == "templates" or args.cases == 0:
        weights = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="llmtrain-fuzz-") as tmp:
        for category, weight in weights.items():
            cases = max(1, round(args.cases * weight))
            copy = category == "config-file"
            with fuzz.fuzz_environment(Path(tmp) / category, data_copy=copy) as env:
                run_category(fuzz, env, category, category, cases, args.seed, tally)
        if args.subprocess and args.only != "templates":
            with fuzz.fuzz_environment(Path(tmp) / "subprocess", data_copy=False) as env:
                run_category(
                    fuzz, env, "combination", "subprocess", args.subprocess, args.seed, tally
                )
        if args.templates:
            run_templates(Path(tmp) / "templates", args.templates, args.seed,
                          args.template_seconds, tally)  # fmt: skip
        if args.headers:
            run_headers(args.headers, args.seed, tally)
    wall = time.perf_counter() - start

    t = tally
    print(
        f"{'category':<18} {'cases':>6} {'exit 2+named':>13} {'valid text':>11} "
        f"{'failed':>7} {'ms/case':>8}"
    )
    for label in t.ran:
        bad = sum(1 for f in t.failed if f.startswith(f"[{label}]"))
        print(
            f"{label:<18} {t.ran[label]:>6} {t.named[label]:>13} {t.valid[label]:>11} {bad:>7} "
            f"{1000 * t.seconds[label] / max(1, t.ran[label]):>8.1f}"
        )
    print(
        f"{'total':<18} {sum(t.ran.values()):>6} {sum(t.named.values()):>13} "
        f"{sum(t.valid.values()):>11} {len(t.failed):>7}   ({wall:.0f} s wall)"
    )
    for line in t.failed:
        print("FAIL", line)
    sys.exit(1 if t.failed else 0)


def run_category(
    fuzz: ModuleType,
    env: Any,
    category: str,
    label: str,
    cases: int,
    seed_value: int,
    tally: Tally,
) -> None:
    """`cases` examples of one category; vias alternate between the app and the entry point."""
    strategy = fuzz.CATEGORIES[category]
    vias = ["subprocess"] if label == "subprocess" else ["app", "entry"]

    @seed(seed_value)
    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, command=st.sampled_from(fuzz.COMMANDS), via=st.sampled_from(vias))
    def one(case: Any, command: str, via: str) -> None:
        start = time.perf_counter()
        verdict = fuzz.check_case(case, command, via, env)
        tally.seconds[label] += time.perf_counter() - start
        tally.ran[label] += 1
        if verdict.problems:
            files = f" files={case.files}" if case.files else ""
            tally.failed.append(
                f"[{label}] {command} {list(case.overrides)} ({via}){files}: {verdict.problems}"
            )
        elif verdict.valid_input:
            tally.valid[label] += 1
        else:
            tally.named[label] += 1

    one()


def run_templates(root: Path, cases: int, seed_value: int, seconds: float, tally: Tally) -> None:
    """`cases` generated chat templates through `data prepare` (see the module docstring)."""
    import json
    import shutil

    from launcher.data.limits import DataLimits
    from tests.chat_fixtures import build_tokenizer
    from tests.cli import invoke

    spec = importlib.util.spec_from_file_location(
        "test_fuzz_templates", ROOT / "tests" / "unit" / "test_fuzz_templates.py"
    )
    assert spec is not None and spec.loader is not None
    grammar = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grammar)
    DataLimits.from_mib = classmethod(lambda cls, mib: cls(mib << 20, seconds))  # type: ignore[assignment]
    tok = build_tokenizer("qwen2.5", root / "tok")
    data = root / "chat.jsonl"
    data.write_text(json.dumps({"messages": grammar.MESSAGES[1:]}) + "\n")
    template, out = root / "t.jinja", root / "out"
    label = "templates"

    @seed(seed_value)
    @settings(max_examples=cases, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(source=grammar.TEMPLATES)
    def one(source: str) -> None:
        template.write_text(source)
        start = time.perf_counter()
        done = invoke("data", "prepare", "--input", str(data), "--tokenizer", str(tok),
                      "--chat-template", str(template), "--output", str(out),
                      timeout=seconds + 60)  # fmt: skip
        took = time.perf_counter() - start
        tally.seconds[label] += took
        tally.ran[label] += 1
        said = done.stdout + done.stderr
        problems = []
        if done.returncode not in (0, 2) or "Traceback" in said:
            problems.append(f"exit {done.returncode}: {said[-500:]!r}")
        if done.returncode == 2 and f"{data}:1" not in said:
            problems.append(f"the records file and line not named: {said[-300:]!r}")
        if grammar.ESC in said or len(said) > 2000:
            problems.append(f"unsafe message ({len(said)} characters)")
        if took > seconds + 30:
            problems.append(f"took {took:.0f} s")
        if any(p.name.startswith(".out") for p in root.iterdir()):
            problems.append("a temporary folder was left behind")
        if problems:
            tally.failed.append(f"[{label}] {source!r}: {problems}")
        elif done.returncode == 0:
            tally.valid[label] += 1
        else:
            tally.named[label] += 1
        if out.exists():
            shutil.rmtree(out)

    one()


if __name__ == "__main__":
    main()
