"""bench/gpu_engine_speed.py's verdicts (pure): which figures fail the issue's targets."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(
            "gpu_engine_speed", BENCH / "gpu_engine_speed.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_engine_speed"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.modules.pop("gpu_engine_speed", None)
        sys.path.remove(str(BENCH))


def _met(bench: ModuleType) -> dict[str, object]:
    R = bench.Result
    return {
        "1b-bf16-compile": R("1b-bf16-compile", 40_000, 0.46, hidden=2048),
        "1b-fp8": R("1b-fp8", 45_000, 0.50, hidden=2048, precision="fp8"),
        "8b4-bf16-compile": R("8b4-bf16-compile", 20_000, 0.46, hidden=4096),
        "8b4-fp8": R("8b4-fp8", 26_000, 0.60, hidden=4096, precision="fp8"),
        "mixtral1-bf16": R("mixtral1-bf16", 10_000, 0.36, hidden=4096),
        "1b-s4k-torch": R("1b-s4k-torch", 30_000, 0.4, hidden=2048),
        "1b-s4k-deepspeed": R("1b-s4k-deepspeed", 28_000, 0.37, hidden=2048),
        "hf-loop": R("hf-loop", 30_000, None, hidden=2048),
    }


def test_all_targets_met_passes() -> None:
    bench = _bench()
    assert bench.verdicts(_met(bench)) == []


def test_each_miss_is_named() -> None:
    bench = _bench()
    results = _met(bench)
    R = bench.Result
    # fp8 slower than bf16 at hidden 4096: a miss of its own besides the 1.25x target.
    results["8b4-fp8"] = R("8b4-fp8", 19_000, 0.44, hidden=4096, precision="fp8")
    results["1b-s4k-deepspeed"] = R("1b-s4k-deepspeed", 25_000, 0.33, hidden=2048)
    results["mixtral1-bf16"] = R("mixtral1-bf16", None, None, hidden=4096, problem="refused")
    misses = bench.verdicts(results)
    assert any("fp8 19,000 tok/s < bf16 20,000" in m for m in misses), misses
    assert any(m.startswith("fp8 vs bf16 (8b shape)") for m in misses), misses
    assert any(m.startswith("DeepSpeed ZeRO-1 vs torch: 1b-s4k-deepspeed 0.83x") for m in misses)
    assert "mixtral1-bf16: refused" in misses
    assert len(misses) == 4, misses


def test_a_missing_reference_case_skips_its_target() -> None:
    bench = _bench()
    results = _met(bench)
    del results["hf-loop"]  # transformers not installed
    assert bench.verdicts(results) == []


def test_cases_are_matrix_entries_and_take_their_figures_from_its_json() -> None:
    """Each case is an entry of the plan bench's matrix (one run serves both benches): with
    --from-matrix its figures come from that JSON, a failed run there is a failed case, and an
    entry the JSON lacks is run (None)."""
    bench = _bench()
    case = next(c for c in bench.CASES if c.name == "1b-bf16-compile")
    assert case.matrix == "1b-s8k-compile" and case.seq == 8192 and case.mbs == 1
    figures = {"step_s": 0.2, "tokens_per_s": 40_960.0, "mfu": 0.44, "first_step_s": 12.9}
    doc = {
        "runs": [
            {"precision": "1b-s8k-compile (published)", "problem": None, "figures": figures},
            {"precision": "1b-s8k-fp8 (published)", "problem": "`llmtrain run` failed"},
        ]
    }
    got = bench.from_matrix(case, [doc])
    assert (got.tokens_per_s, got.mfu, got.step_s, got.first_step_s) == (40_960.0, 0.44, 0.2, 12.9)
    fp8 = next(c for c in bench.CASES if c.name == "1b-fp8")
    failed = bench.from_matrix(fp8, [doc])
    assert failed.problem == "`llmtrain run` failed" and failed.precision == "fp8"
    mixtral = next(c for c in bench.CASES if c.name == "mixtral1-bf16")
    assert bench.from_matrix(mixtral, [doc]) is None
