"""Operator profiles (llmtrain calibrate's output) read, validated and priced by the planner.

Expected values are derived by hand in the comments.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.errors import UserError
from launcher.plan.hardware import profile as prof
from launcher.plan.memory.estimate import bytes_per_param
from launcher.plan.operators import elementwise_bytes, operators
from launcher.plan.planner import make_plan
from launcher.plan.timing.estimate import stage_compute_parts
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit
MS = 1e-3
TINY = ["recipe=tiny"]  # 4 layers, h 128, ffn 512, 4 heads (d 32), vocab 256, seq 256, mbs 8, fp32


def tiny_profile(cluster_gpu: str = "cpu") -> dict[str, Any]:
    """Round figures for every operator of recipe=tiny (2 threads per process: cores // 1)."""
    cfg = compose_config(TINY).config
    ops = operators(cfg, derive_layout(cfg))
    threads = prof.cpu_threads(1)
    tag = {"dtype": "fp32", "threads": threads}
    doc: dict[str, Any] = {
        "schema": prof.SCHEMA,
        "version": prof.VERSION,
        "device": {"cluster_gpu": cluster_gpu, "kind": "cpu", "name": prof.host_cpu_name()},
        "software": {"torch": "test"},
        "created": "2026-11-25T00:00:00Z",
        # t = 8 x 256 = 2048 tokens: wq/wk/wv/wo 2048x128x128, w1 2048x512x128, w2 2048x128x512,
        # head 2048x256x128; each 1 ms forward, 2 ms backward.
        "gemm": [
            {**tag, "m": m, "n": n, "k": k, "fwd_s": 1 * MS, "bwd_s": 2 * MS}
            for m, n, k in ((2048, 128, 128), (2048, 512, 128), (2048, 128, 512), (2048, 256, 128))
        ],
        "attention": [
            {
                **tag,
                "kind": "flash",
                "batch": 8,
                "heads": 4,
                "kv_heads": 4,
                "seq": 256,
                "head_dim": 32,
                "fwd_s": 2 * MS,
                "bwd_s": 4 * MS,
            }
        ],
        "elementwise": [
            {
                **tag,
                "tokens": 2048,
                "hidden": 128,
                "ffn": 512,
                "bytes": elementwise_bytes(ops, 4),
                "fwd_s": 1 * MS,
                "bwd_s": 1 * MS,
            }
        ],
        "loss": [{**tag, "tokens": 2048, "vocab": 256, "fwd_s": 1 * MS, "bwd_s": 1 * MS}],
        "optimizer": [{"threads": threads, "params": 1_000_000, "seconds": 10 * MS}],
        "collectives": [],
    }
    doc["digest"] = prof.digest(doc)
    return doc


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_a_profile_prices_the_step_from_its_measured_operators(tmp_path: Path) -> None:
    path = write(tmp_path / "p.json", tiny_profile())
    cfg = compose_config([*TINY, f"cluster.profile={path}"]).config
    plan = make_plan(cfg)
    # Per layer: 6 GEMMs (wq, wk, wv, wo, w1, w2) x (1 + 2) ms = 18 ms; 4 layers = 72 ms.
    # Output layer 3 ms + loss 2 ms = 5 ms. Attention (2 + 4) ms x 4 = 24 ms.
    # Element-wise (1 + 1) ms x 4 = 8 ms. Compute: 72 + 5 + 24 + 8 = 109 ms.
    assert plan.time.compute_s == pytest.approx(0.109, rel=1e-9)
    # Optimizer: 10 ms per million parameters, on this rank's P parameters.
    params = plan.memory.heaviest.optimizer / bytes_per_param(cfg).optimizer
    assert plan.time.optimizer_s == pytest.approx(0.010 * params / 1e6, rel=1e-9)
    assert plan.time.step_s == pytest.approx(0.109 + 0.010 * params / 1e6, rel=1e-9)
    assert plan.profile is not None and plan.profile.origin == "cluster.profile"
    sources = dict(plan.sources)
    assert sources["linear_gemms"] == "profile" and sources["attention"] == "profile"
    assert plan.time_band is not None and plan.time_band.source == "profile"


def test_the_profile_changes_the_plan(tmp_path: Path) -> None:
    published = make_plan(compose_config(TINY).config)
    assert published.profile is None and published.time_band is not None
    assert published.time_band.source == "leave-one-source-out"
    doc = tiny_profile()
    slow = copy.deepcopy(doc)
    for g in slow["gemm"]:
        g["fwd_s"] *= 2
        g["bwd_s"] *= 2
    slow["digest"] = prof.digest(slow)
    fast_plan = make_plan(
        compose_config([*TINY, f"cluster.profile={write(tmp_path / 'a.json', doc)}"]).config
    )
    slow_plan = make_plan(
        compose_config([*TINY, f"cluster.profile={write(tmp_path / 'b.json', slow)}"]).config
    )
    # Doubling every GEMM adds the 72 + 3 ms of GEMMs once more.
    assert slow_plan.time.step_s - fast_plan.time.step_s == pytest.approx(0.075, rel=1e-9)
    assert fast_plan.time.step_s != pytest.approx(published.time.step_s, rel=1e-3)


def test_lookups_scale_unmeasured_shapes_by_flops() -> None:
    doc = tiny_profile()
    r = prof.rates(doc, "fp32", prof.cpu_threads(1))
    # Measured exactly: as measured.
    assert r.gemm(2048, 128, 128) == (1 * MS, 2 * MS, True)
    # 2048 x 128 x 256: nearest measured is 2048x128x128 (log distance ln 2) or 2048x128x512
    # (ln 2), ties broken by the sorted order (128 first): twice its FLOPs -> 2 ms, 4 ms.
    f, b, exact = r.gemm(2048, 128, 256)  # type: ignore[misc]
    assert (f, b, exact) == (pytest.approx(2 * MS), pytest.approx(4 * MS), False)
    # Attention at seq 512 (batch 8, heads 4, d 32): 4x the FLOPs of seq 256 -> 8 ms, 16 ms.
    fa, ba, exact_a = r.attention_s("flash", 8, 4, 4, 512, 32)  # type: ignore[misc]
    assert (fa, ba, exact_a) == (pytest.approx(8 * MS), pytest.approx(16 * MS), False)
    # Loss at 4096 tokens over 256: twice the logits -> 2 ms, 2 ms.
    assert r.loss_s(4096, 256) == (pytest.approx(2 * MS), pytest.approx(2 * MS))
    # Optimizer: 10 ms per 1e6 parameters -> 2.5e5 parameters 2.5 ms.
    assert r.optimizer_s(250_000) == pytest.approx(2.5 * MS)
    # Nothing of another dtype or thread count.
    assert prof.rates(doc, "bf16", prof.cpu_threads(1)).gemm(2048, 128, 128) is None


def test_optimistic_lookups_take_the_fastest_rate_of_each_class() -> None:
    """The search's bound (Rates.optimistic): every shape at its class's fastest measured rate."""
    doc = tiny_profile()
    r = prof.rates(doc, "fp32", prof.cpu_threads(1))
    fast = r.optimistic()
    # Every GEMM measured at 1 ms forward, 2 ms backward; 2048x128x512 and 2048x512x128 do 4x
    # the work of 2048x128x128 in that time, the fastest rate: 2048x128x128 is bounded by
    # 1 / 4 = 0.25 ms forward and 0.5 ms backward (measured: 1 ms, 2 ms).
    assert fast.gemm(2048, 128, 128) == (pytest.approx(0.25 * MS), pytest.approx(0.5 * MS), False)
    assert r.gemm(2048, 128, 128) == (1 * MS, 2 * MS, True)
    # One attention, one element-wise, one loss row: the same figures as the exact lookup.
    assert fast.attention_s("flash", 8, 4, 4, 512, 32)[:2] == pytest.approx((8 * MS, 16 * MS))
    assert fast.loss_s(4096, 256) == pytest.approx((2 * MS, 2 * MS))
    assert fast.elementwise_per_byte(1.0) == r.elementwise_per_byte(1.0)
    # Never slower than the exact lookup, for any shape.
    for shape in ((2048, 128, 128), (4096, 512, 128), (100, 100, 100), (2048, 256, 128)):
        exact, bound = r.gemm(*shape), fast.gemm(*shape)
        assert exact is not None and bound is not None
        assert bound[0] <= exact[0] * (1 + 1e-12) and bound[1] <= exact[1] * (1 + 1e-12)


def test_context_parallel_attention_is_cp_blocks_of_the_measured_one(tmp_path: Path) -> None:
    """cp = 2: each rank holds s / 2 = 128 tokens and runs two blocks of them in the ring: the
    attention of the step is cp x the causal block of seq 128, half of seq 256's (the work is
    split over two ranks), not the quarter that one block of 128 tokens would be."""
    doc = tiny_profile()
    two = prof.cpu_threads(2)  # threads per process of a run of two processes here
    for section in ("gemm", "attention", "elementwise", "loss", "optimizer"):
        for e in doc[section]:
            e["threads"] = two
    doc["digest"] = prof.digest(doc)
    path = write(tmp_path / "p.json", doc)
    cp2 = make_plan(
        compose_config(
            [*TINY, f"cluster.profile={path}", "cluster.gpus_per_node=2", "parallel.cp=2"]
        ).config
    )
    assert dict(cp2.sources)["attention"] == "profile (scaled)"
    # seq 128 is a quarter of seq 256's work: (2 + 4) / 4 = 1.5 ms a block, x cp 2 = 3 ms a
    # layer, x 4 layers = 12 ms (24 ms at cp 1: the work is split over the two ranks).
    parts = stage_compute_parts(cp2.config, cp2.layout, cp2.hardware, 0)
    assert parts.attention_s == pytest.approx(12 * MS, rel=1e-9)


def test_optimizer_fits_fixed_cost_plus_cost_per_parameter() -> None:
    """Two sizes measured (calibrate times the rank's count and a quarter of it): the step's
    fixed cost is not scaled with the parameters, as one proportional size would."""
    doc = tiny_profile()
    doc["optimizer"] = [
        {"threads": prof.cpu_threads(1), "params": 1_000_000_000, "seconds": 10 * MS},
        {"threads": prof.cpu_threads(1), "params": 250_000_000, "seconds": 4 * MS},
    ]
    r = prof.rates(doc, "fp32", prof.cpu_threads(1))
    # slope (10 - 4) ms / 7.5e8 = 8 ms per 1e9, intercept 10 - 8 = 2 ms: 2e9 -> 2 + 16 = 18 ms
    # (from 2.5e8 alone, proportionally: 32 ms; from 1e9 alone: 20 ms).
    assert r.optimizer_s(2_000_000_000) == pytest.approx(18 * MS)
    assert r.optimizer_s(1_000_000_000) == pytest.approx(10 * MS)


def test_collectives_fit_latency_plus_bandwidth() -> None:
    doc = tiny_profile()
    doc["collectives"] = [
        {"threads": 1, "kind": "all-reduce", "ranks": 2, "bytes": 1_000_000, "seconds": 7 * MS},
        {"threads": 1, "kind": "all-reduce", "ranks": 2, "bytes": 250_000, "seconds": 3 * MS},
    ]
    r = prof.rates(doc, "fp32", 1)
    # slope = (7 - 3) ms / 750 kB = 5.333e-9 s/B; latency = 3 ms - 250 kB x slope = 1.667 ms;
    # 2 MB: 1.667 + 10.667 = 12.333 ms.
    assert r.collective_s("all-reduce", 2, 2_000_000) == pytest.approx(12.3333 * MS, rel=1e-4)
    assert r.collective_s("all-gather", 2, 2_000_000) is None
    assert r.collective_s("all-reduce", 4, 2_000_000) is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda d: d["gemm"][0].update(fwd_s=0.5), "digest does not match"),
        (lambda d: d.update(version=99), "version 99"),
        (lambda d: d.update(schema="other"), "not an llmtrain profile"),
    ],
)
def test_a_tampered_or_foreign_profile_is_refused_naming_the_key(
    tmp_path: Path, change: Any, reason: str
) -> None:
    doc = tiny_profile()
    change(doc)
    path = write(tmp_path / "p.json", doc)
    cfg = compose_config([*TINY, f"cluster.profile={path}"]).config
    with pytest.raises(UserError, match=reason) as info:
        make_plan(cfg)
    assert f"cluster.profile={path}" in str(info.value)


def test_plan_exits_2_naming_cluster_profile(tmp_path: Path) -> None:
    doc = tiny_profile()
    doc["optimizer"][0]["seconds"] = 1.0  # edited after calibrate wrote it
    path = write(tmp_path / "p.json", doc)
    done = invoke("plan", *TINY, f"cluster.profile={path}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"cluster.profile={path}: its digest does not match" in done.stderr
    assert "Traceback" not in done.stderr and "cluster.profile=none" in done.stderr


def test_a_profile_of_another_device_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "p.json", tiny_profile(cluster_gpu="h100-80gb"))
    with pytest.raises(UserError, match=r"not on cluster\.gpu=cpu"):
        make_plan(compose_config([*TINY, f"cluster.profile={path}"]).config)


def test_the_cached_profile_is_used_and_a_bad_one_ignored_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMTRAIN_PROFILE_DIR", str(tmp_path))
    write(tmp_path / "cpu.json", tiny_profile())
    plan = make_plan(compose_config(TINY).config)
    assert plan.profile is not None and plan.profile.origin == "cache"
    result = invoke("plan", *TINY, "--json")
    pricing = json.loads(result.stdout)["time"]["pricing"]
    assert pricing["source"] == "profile" and pricing["profile"]["origin"] == "cache"
    assert pricing["parts"]["optimizer"] == "profile"
    # cluster.profile=none: published figures even with a cache.
    none = make_plan(compose_config([*TINY, "cluster.profile=none"]).config)
    assert none.profile is None
    # A cached profile edited by hand: ignored, with a note; exit 0.
    doc = tiny_profile()
    doc["gemm"][0]["fwd_s"] = 1.0
    write(tmp_path / "cpu.json", doc)
    plan = make_plan(compose_config(TINY).config)
    assert plan.profile is None and plan.profile_note and "ignored" in plan.profile_note
    result = invoke("plan", *TINY)
    assert result.returncode == 0 and "ignored" in shown(result)
    assert "published figures" in shown(result)


def test_plan_json_names_published_figures_without_a_profile() -> None:
    result = invoke("plan", *TINY, "--json")
    pricing = json.loads(result.stdout)["time"]["pricing"]
    assert pricing == {"source": "published figures", "profile": None, "parts": None, "note": None}


def test_a_profile_without_figures_for_the_dtype_is_not_used_and_says_so(tmp_path: Path) -> None:
    path = write(tmp_path / "p.json", tiny_profile())  # fp32 figures only
    plan = make_plan(compose_config([*TINY, "precision=bf16", f"cluster.profile={path}"]).config)
    assert plan.profile is None
    assert plan.profile_note is not None and "no figures for bf16" in plan.profile_note
