"""precision=fp8 (torchao float8 in the torch engine): what is refused, with what works instead;
which layers the engine converts; torchao's import noise kept off the terminal."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launcher.backends import refusals
from launcher.config.composition.compose import compose_config
from launcher.config.schema import LLMTrainConfig
from launcher.launch.preflight import fp8_problems
from launcher.validate.rules import check

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.

FP8 = ("recipe=tiny", "precision=fp8", "backend=torch")
EMULATE = "precision.fp8_emulate=true"


def cfg_of(*overrides: str) -> LLMTrainConfig:
    return compose_config([*FP8, *overrides]).config


def reasons(*overrides: str) -> list[str]:
    return [r.message for r in refusals(cfg_of(*overrides))]


def errors(*overrides: str) -> list[str]:
    return [v.message for v in check(cfg_of(*overrides)) if v.is_error]


def test_cpu_refused_without_emulation_naming_what_works() -> None:
    (found,) = reasons()
    assert found.startswith("precision=fp8 on CPU"), found
    for works in ("cluster=h100-80gb", "precision=bf16", "precision.fp8_emulate=true"):
        assert works in found, found


def test_emulated_fp8_runs_on_cpu_and_real_fp8_on_hopper() -> None:
    assert errors(EMULATE) == []
    assert errors("cluster=h100-80gb", "cluster.num_nodes=1", "cluster.gpus_per_node=1") == []
    assert errors("cluster=b200", "cluster.num_nodes=1", "cluster.gpus_per_node=1") == []


@pytest.mark.parametrize("gpu", ["a100-80gb", "a100-40gb"])
def test_gpu_without_fp8_refused_unless_emulated(gpu: str) -> None:
    one = (f"cluster={gpu}", "cluster.num_nodes=1", "cluster.gpus_per_node=1")
    (found,) = errors(*one)
    assert "fp8 tensor cores" in found, found
    assert f"cluster.gpu={gpu}" in found and "precision.fp8_emulate=true" in found, found
    assert errors(*one, EMULATE) == []


@pytest.mark.parametrize(
    ("overrides", "key", "works"),
    [
        (["model.hidden_size=72", "model.num_attention_heads=4"], "model.hidden_size", "80"),
        (["model.ffn_hidden_size=120"], "model.ffn_hidden_size", "128"),
        # Under tp each rank's share of the MLP columns must divide by 16: 144 / 2 = 72 does not.
        (
            ["model.ffn_hidden_size=144", "parallel.tp=2", "cluster.gpus_per_node=2"],
            "model.ffn_hidden_size",
            "160",
        ),
    ],
)
def test_dimensions_not_divisible_by_16_refused(overrides: list[str], key: str, works: str) -> None:
    (found,) = reasons(EMULATE, *overrides)
    assert f"with {key}" in found and f"use {key}={works}" in found, found
    fixed = [o for o in overrides if not o.startswith(key)] + [f"{key}={works}"]
    assert reasons(EMULATE, *fixed) == []


def test_sequence_parallel_refused_on_cpu_only() -> None:
    sp = ("parallel.tp=2", "parallel.sequence_parallel=true", "cluster.gpus_per_node=2")
    (found,) = reasons(EMULATE, *sp)
    assert "gloo" in found and "parallel.sequence_parallel=false" in found, found
    assert reasons("cluster=h100-80gb", "cluster.num_nodes=1", *sp) == []


def test_deepspeed_refusal_says_why_and_points_to_torch() -> None:
    one_h100 = ["cluster=h100-80gb", "cluster.num_nodes=1", "cluster.gpus_per_node=1"]
    cfg = compose_config(["recipe=tiny", "precision=fp8", "backend=deepspeed", *one_h100]).config
    (found,) = [r.message for r in refusals(cfg)]
    assert "Transformer Engine" in found and "backend=torch precision=fp8" in found, found


def test_preflight_refuses_fp8_without_torchao(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = cfg_of(EMULATE)
    assert fp8_problems(cfg, local=True) == []  # torchao is installed here (dev extra)
    import importlib.util

    real = importlib.util.find_spec
    # A Python environment without torchao (mocked: this one has it).
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a)
    )
    (found,) = fp8_problems(cfg, local=True)
    assert "pip install 'llmtrain[fp8]'" in found and "precision=bf16" in found, found
    assert fp8_problems(compose_config(["recipe=tiny"]).config, local=True) == []


def _converted(*overrides: str) -> set[str]:
    pytest.importorskip("torchao")
    from launcher.train.model import fp8
    from launcher.train.model.transformer import build_model

    model = build_model(cfg_of(EMULATE, *overrides).model, "cpu")
    names = set(fp8.convert(model, emulate=True, fsdp=False))
    assert names == {n for n, m in model.named_modules() if fp8.is_float8_linear(m)}
    return names


def test_converted_layers_are_the_block_projections() -> None:
    llama = ("model.activation=swiglu", "model.tie_embeddings=false", "model.num_layers=2")
    expected = {
        f"layers.{i}.{p}"
        for i in range(2)
        for p in (
            "attention.wq",
            "attention.wk",
            "attention.wv",
            "attention.wo",
            "feed_forward.w1",
            "feed_forward.w2",
            "feed_forward.w3",
        )
    }
    assert _converted(*llama) == expected  # not the head, not the embeddings


def test_moe_refused_with_fp8() -> None:
    moe = ("model.num_experts=4", "model.moe_top_k=2", "model.moe_ffn_hidden_size=64")
    (found,) = reasons(EMULATE, *moe)
    assert "empty token batch" in found and "precision=bf16" in found, found


@pytest.mark.integration
def test_torchao_import_noise_is_filtered() -> None:
    pytest.importorskip("torchao")
    noisy = subprocess.run(
        [sys.executable, "-c", "import torchao.float8"], capture_output=True, text=True
    )
    quiet = subprocess.run(
        [
            sys.executable,
            "-c",
            "from launcher.train.model import fp8; fp8.float8(); fp8.tp_styles('tensorwise')",
        ],
        capture_output=True,
        text=True,
    )
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "Failed to load" not in quiet.stderr and "Enum subclass" not in quiet.stderr
    # What the filter is for, on this torch (torchao's C++ kernels do not load); a later torchao
    # may import quietly by itself.
    print("torchao's own import noise:", noisy.stderr.count("\n"), "lines")


def test_converted_model_rounds_through_fp8() -> None:
    """The same weights, the same input: the converted model's output departs from the bf16
    model's by fp8's rounding (e4m3 keeps 3 mantissa bits: ~2^-4 relative per element), far more
    than bf16's own (8 bits: ~2^-9), so an fp8 run that silently trained in bf16 shows here."""
    pytest.importorskip("torchao")
    import copy

    import torch

    from launcher.train.model import fp8
    from launcher.train.model.init_weights import init_weights
    from launcher.train.model.transformer import build_model

    model = build_model(cfg_of(EMULATE, "model.num_layers=2").model, "cpu")
    init_weights(model, 0)
    converted = copy.deepcopy(model)
    fp8.convert(converted, emulate=True, fsdp=False)
    tokens = torch.arange(64).view(2, 32) % 256
    with torch.no_grad():
        full = model(tokens).float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16, f8 = model(tokens).float(), converted(tokens).float()

    def rel(a: torch.Tensor) -> float:
        return float((a - full).norm() / full.norm())

    print(f"relative error vs fp32: bf16 {rel(bf16):.1e}, fp8 {rel(f8):.1e}")
    assert rel(bf16) < 1e-2 < rel(f8) < 0.2


def test_engine_device_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's start-up check of the real device (an A100 is mocked: no GPU here)."""
    import torch

    from launcher.train.model import fp8

    cpu = fp8.device_problem(torch.device("cpu"), emulate=False)
    assert cpu is not None and "precision.fp8_emulate=true" in cpu and "h100" in cpu
    assert fp8.device_problem(torch.device("cpu"), emulate=True) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100 (mocked)")
    a100 = fp8.device_problem(torch.device("cuda", 0), emulate=False)
    assert a100 is not None and "has 8.0" in a100 and "precision=bf16" in a100, a100
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fp8.device_problem(torch.device("cuda", 0), emulate=False) is None


def test_emulate_without_fp8_warns() -> None:
    cfg = compose_config(["recipe=tiny", "precision=bf16", EMULATE]).config
    (found,) = [v for v in check(cfg) if "fp8_emulate" in v.message]
    assert not found.is_error and "precision=fp8" in found.message, found


def test_real_fp8_converts_only_the_gemms_that_gain() -> None:
    """Not emulated: torchao's size rule (engine_choices) picks the layers; llama3-1b's wk/wv
    (N = 512) stay bf16, as `plan` states. Built on the meta device (nothing allocated)."""
    pytest.importorskip("torchao")
    from launcher.backends.engine_choices import engine_choices
    from launcher.train.model import fp8
    from launcher.train.model.transformer import build_model

    config = compose_config(["recipe=llama3-1b", "model.num_layers=1"]).config
    model = build_model(config.model, "meta")
    names = fp8.convert(model, emulate=False, fsdp=False)
    short = tuple(n.rsplit(".", 1)[-1] for n in names)
    assert set(short) == {"wq", "wo", "w1", "w2", "w3"}
    fp8_config = compose_config(["recipe=llama3-1b", "precision=fp8", "cluster=h100-80gb"]).config
    assert set(engine_choices(fp8_config).fp8_layers) == set(short)
