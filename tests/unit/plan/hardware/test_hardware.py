"""The GPU catalog (launcher/plan/hardware/lookup.py) and the cluster profiles that point into
it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from launcher.config.schema import ClusterConfig
from launcher.plan.hardware.lookup import (
    CATALOG,
    PRECISIONS,
    GiB,
    GPUSpec,
    UnknownGPUError,
    get_gpu,
    known_gpus,
)

pytestmark = pytest.mark.unit

CLUSTER_DIR = Path(__file__).resolve().parents[4] / "conf" / "cluster"
CLUSTER_FILES = sorted(CLUSTER_DIR.glob("*.yaml"))
CLUSTER_FIELDS = {f.name for f in dataclasses.fields(ClusterConfig)}

EXPECTED_GPUS = {
    "cpu",
    "v100-32gb",
    "a100-40gb",
    "a100-80gb",
    "h100-sxm",
    "h100-pcie",
    "h100-96gb",
    "h800",
    "h200",
    "b200",
    "gb200",
    "mi300x",
    "tpu-v4",
    "tpu-v5p",
    # The cards people own or rent one at a time (launcher/plan/hardware/gpu_catalog_owned.py).
    "rtx3090",
    "rtx4090",
    "rtx5090",
    "a6000",
    "l40s",
    "l4",
    "a10g",
}
EXPECTED_PROFILES = (EXPECTED_GPUS - {"h100-sxm"}) | {"h100-80gb"}


def _load(path: Path) -> dict[str, object]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path.name} is not a mapping"
    return data


# --- cluster profiles ---------------------------------------------------------------------


def test_every_expected_profile_exists() -> None:
    assert {p.stem for p in CLUSTER_FILES} >= EXPECTED_PROFILES


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.stem)
def test_profile_keys_are_exactly_cluster_config_fields(path: Path) -> None:
    assert set(_load(path)) == CLUSTER_FIELDS


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.stem)
def test_profile_names_a_catalog_gpu(path: Path) -> None:
    data = _load(path)
    assert data["name"] == path.stem
    gpu = get_gpu(str(data["gpu"]))
    assert data["gpus_per_node"] == gpu.default_gpus_per_node
    assert data["gpu_request"] in ("gpus-per-node", "gres")
    assert isinstance(data["env"], dict)
    assert all(isinstance(v, str) for v in data["env"].values())


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.stem)
def test_profile_starts_with_a_comment(path: Path) -> None:
    assert path.read_text().startswith("# ")


def test_profile_values_build_a_cluster_config() -> None:
    for path in CLUSTER_FILES:
        ClusterConfig(**_load(path))  # type: ignore[arg-type]


# --- catalog ------------------------------------------------------------------------------


def test_catalog_has_every_expected_gpu() -> None:
    assert set(known_gpus()) == EXPECTED_GPUS
    assert known_gpus() == sorted(known_gpus())


@pytest.mark.parametrize("key", sorted(EXPECTED_GPUS))
def test_spec_figures_are_positive(key: str) -> None:
    spec = get_gpu(key)
    assert spec.key == key
    assert spec.memory_bytes > 0
    assert spec.memory_bandwidth_gbps > 0
    assert spec.intra_node_bandwidth_gbps > 0
    assert spec.inter_node_bandwidth_gbps > 0
    assert spec.default_gpus_per_node >= 1
    assert spec.scale_up_domain >= spec.default_gpus_per_node
    assert 0 < spec.matmul_efficiency <= 1
    assert spec.price_per_gpu_hour >= 0
    assert 0 <= spec.cuda_context_bytes < spec.memory_bytes
    assert spec.tdp_watts is None or spec.tdp_watts > 0
    assert set(spec.peak_tflops) <= set(PRECISIONS)
    assert "fp32" in spec.peak_tflops
    assert all(v > 0 for v in spec.peak_tflops.values())
    if key != "cpu":
        assert spec.price_per_gpu_hour > 0


@pytest.mark.parametrize("key", sorted(EXPECTED_GPUS))
def test_low_precision_is_never_slower_than_fp32(key: str) -> None:
    peaks = get_gpu(key).peak_tflops
    for p in ("tf32", "bf16", "fp16", "fp8"):
        if p in peaks:
            assert peaks[p] >= peaks["fp32"]
    if "fp8" in peaks:
        assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"], rel=0.01)


@pytest.mark.parametrize("key", sorted(EXPECTED_GPUS))
def test_precision_flags_follow_the_architecture(key: str) -> None:
    spec = get_gpu(key)
    assert spec.supports_fp8 == (spec.arch in ("ada", "hopper", "blackwell", "cdna3"))
    assert spec.supports_bf16 == (spec.arch != "volta")
    assert spec.supports_bf16 == spec.supports("bf16")
    assert spec.supports_fp8 == spec.supports("fp8")


def test_gpu_memory_is_what_the_device_reports() -> None:
    # nvidia-smi memory.total: the marketed "80GB" is 81559 MiB on an H100, 81920 MiB on an A100.
    assert get_gpu("h100-sxm").memory_bytes == 81559 * 2**20
    assert get_gpu("a100-80gb").memory_bytes == 80 * GiB
    assert 79 < get_gpu("h100-sxm").memory_gib < 80
    for key in ("h200", "b200", "gb200", "mi300x"):
        assert get_gpu(key).memory_gib > 130


def test_spec_is_frozen_and_read_only() -> None:
    spec = get_gpu("h100-sxm")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.price_per_gpu_hour = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.peak_tflops["bf16"] = 1.0  # type: ignore[index]
    assert hash(spec) == hash(get_gpu("h100-sxm"))


def test_inconsistent_spec_is_rejected() -> None:
    base = CATALOG["a100-80gb"]
    with pytest.raises(ValueError, match="supports_fp8"):
        dataclasses.replace(base, supports_fp8=True)
    with pytest.raises(ValueError, match="matmul_efficiency"):
        dataclasses.replace(base, matmul_efficiency=1.5)
    with pytest.raises(ValueError, match="fp32"):
        dataclasses.replace(base, peak_tflops={"bf16": 312.0})


def test_peak_flops_and_unsupported_precision() -> None:
    h100 = get_gpu("h100-sxm")
    assert h100.peak_flops("bf16") == pytest.approx(989.4e12)
    assert h100.achievable_flops("bf16") == pytest.approx(989.4e12 * h100.matmul_efficiency)
    with pytest.raises(ValueError, match="no native bf16"):
        get_gpu("v100-32gb").peak_flops("bf16")
    with pytest.raises(ValueError, match="unknown precision"):
        h100.peak_flops("int4")


# --- datasheet spot checks ----------------------------------------------------------------


def test_datasheet_spot_checks() -> None:
    # NVIDIA A100 datasheet: BF16 tensor core 312 TFLOP/s dense (624 with sparsity).
    assert get_gpu("a100-80gb").peak_tflops["bf16"] == pytest.approx(312)
    assert get_gpu("a100-40gb").peak_tflops["bf16"] == pytest.approx(312)
    # NVIDIA H100 SXM datasheet: BF16 1979 TFLOP/s with sparsity, 989 dense.
    assert get_gpu("h100-sxm").peak_tflops["bf16"] == pytest.approx(989, abs=1)
    # NVIDIA "Programming Tensor Cores in CUDA 9": V100 tensor cores 125 TFLOP/s (fp16).
    assert get_gpu("v100-32gb").peak_tflops["fp16"] == pytest.approx(125)
    # NVIDIA H100 SXM: NVLink4 900 GB/s bidirectional = 450 GB/s each way.
    assert get_gpu("h100-sxm").intra_node_bandwidth_gbps == pytest.approx(450)
    # H800: NVLink cut to 400 GB/s bidirectional; same tensor cores as H100 SXM.
    assert get_gpu("h800").intra_node_bandwidth_gbps == pytest.approx(200)
    assert get_gpu("h800").peak_tflops == get_gpu("h100-sxm").peak_tflops
    # 400 Gb/s NDR InfiniBand per H100 = 50 GB/s; 200 Gb/s HDR per A100 = 25 GB/s.
    assert get_gpu("h100-sxm").inter_node_bandwidth_gbps == pytest.approx(50)
    assert get_gpu("a100-80gb").inter_node_bandwidth_gbps == pytest.approx(25)
    # AMD MI300X: 1307.4 TFLOP/s dense bf16; Cloud TPU docs: v4 275, v5p 459 bf16 per chip.
    assert get_gpu("mi300x").peak_tflops["bf16"] == pytest.approx(1307.4)
    assert get_gpu("tpu-v4").peak_tflops["bf16"] == pytest.approx(275)
    assert get_gpu("tpu-v5p").peak_tflops["bf16"] == pytest.approx(459)
    # torchtitan's 500 W HBM2e H100 peaks below the H100 SXM.
    assert get_gpu("h100-96gb").peak_tflops["bf16"] < get_gpu("h100-sxm").peak_tflops["bf16"]
    # GB200 NVL72: 72 GPUs in one NVLink domain, 4 per compute tray.
    assert get_gpu("gb200").scale_up_domain == 72
    assert get_gpu("gb200").default_gpus_per_node == 4


def test_cpu_device_is_modest_and_free() -> None:
    cpu = get_gpu("cpu")
    assert cpu.memory_bytes == 16 * GiB
    assert cpu.price_per_gpu_hour == 0
    assert cpu.peak_tflops["fp32"] < get_gpu("v100-32gb").peak_tflops["fp32"]
    assert not cpu.supports("fp16")


# --- lookup errors ------------------------------------------------------------------------


def test_lookup_is_case_and_separator_insensitive() -> None:
    assert get_gpu("H100-SXM") is get_gpu("h100-sxm")
    assert get_gpu("tpu_v5p") is get_gpu("tpu-v5p")


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        ("h100", "h100-sxm"),
        ("h100-80gb", "h100-sxm"),
        ("a100", "a100-80gb"),
        ("mi300", "mi300x"),
        ("tpuv5p", "tpu-v5p"),
        ("b2000", "b200"),
        ("gb-200", "gb200"),
    ],
)
def test_unknown_gpu_suggests(typed: str, suggested: str) -> None:
    with pytest.raises(UnknownGPUError) as info:
        get_gpu(typed)
    assert info.value.suggestion == suggested
    assert f"did you mean {suggested!r}" in str(info.value)


def test_unknown_gpu_error_lists_known_keys() -> None:
    with pytest.raises(KeyError) as info:  # UnknownGPUError is a KeyError
        get_gpu("rtx-9090-xyz")
    err = info.value
    assert isinstance(err, UnknownGPUError)
    assert err.key == "rtx-9090-xyz"
    assert err.known_keys == tuple(known_gpus())
    message = str(err)
    assert message.startswith("unknown GPU 'rtx-9090-xyz'")
    for key in known_gpus():
        assert key in message


def test_catalog_values_are_gpu_specs() -> None:
    assert all(isinstance(v, GPUSpec) and k == v.key for k, v in CATALOG.items())
