"""The speed features of Megatron-Core recipes (backend.tp_comm_overlap, cuda_graphs,
cuda_graph_scope, overlap_param_gather_with_optimizer_step, fp8_scaling, moe_permute_fusion,
moe_router_fusion) and Megatron-FSDP's buffers: Megatron's own refusals (exit 2 naming the key),
the flags rendered, torch refusing the Megatron-only keys, and each priced by what it removes or
adds. Expected values by hand from the formulas' sources (launcher/plan/speed_features.py,
launcher/plan/memory/megatron_fsdp.py)."""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.memory.estimate import stage_activations, stage_buffers
from launcher.plan.memory.megatron_fsdp import megatron_fsdp_buffers, whole_units
from launcher.plan.planner import hardware_view, make_plan
from launcher.plan.speed_features import KERNEL_GAP_GRAPHED_S, KERNEL_GAP_S
from launcher.plan.timing.estimate import stage_compute_parts
from launcher.render.megatron_args import megatron_args
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit

DENSE = [
    "model=llama3-8b",
    "backend=megatron",
    "cluster=h100-80gb",
    "cluster.num_nodes=2",
    "parallel.tp=2",
    "parallel.pp=2",
    "parallel.vpp=2",
    "parallel.pp_schedule=interleaved",
    "parallel.sequence_parallel=true",
    "zero.stage=1",
    "train.steps=10",
    "train.global_batch_size=64",
    "precision=bf16",
    "train.recompute=none",
]
MOE = [
    "recipe=deepseek-v3",
    "model.num_layers=4",
    "model.moe_dense_layers=1",
    "model.mtp_layers=0",
    "parallel.pp=1",
    "parallel.pp_layers=null",
    "parallel.ep=8",
    "parallel.etp=1",
    "cluster=h100-80gb",
    "cluster.num_nodes=1",
    "train.tokens=null",
    "train.steps=10",
    "train.global_batch_size=64",
    "precision=bf16",
    "train.recompute=none",
]


def cfg(*overrides: str) -> LLMTrainConfig:
    return compose_config(list(overrides)).config


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["backend.tp_comm_overlap=true", "parallel.sequence_parallel=false"],
         "backend.tp_comm_overlap", "parallel.sequence_parallel=true"),
        (["backend.cuda_graph_scope=[attn]"], "backend.cuda_graph_scope", "transformer_engine"),
        (["backend.cuda_graphs=transformer_engine", "backend.cuda_graph_scope=[full_iteration]"],
         "backend.cuda_graph_scope", "local"),
        (["backend.cuda_graphs=local", "backend.cuda_graph_scope=[attn]"],
         "backend.cuda_graph_scope", "transformer_engine"),
        (["backend.cuda_graphs=transformer_engine", "backend.cuda_graph_scope=[moe_router]"],
         "backend.cuda_graph_scope", "dense model"),
        (["backend.cuda_graphs=transformer_engine", "train.recompute=full"],
         "backend.cuda_graphs", "full_iteration"),
        (["backend.cuda_graphs=transformer_engine", "backend.cuda_graph_scope=[mamba]"],
         "backend.cuda_graph_scope", "'mamba'"),
        (["backend.overlap_param_gather_with_optimizer_step=true", "parallel.vpp=1",
          "parallel.pp_schedule=1f1b"],
         "backend.overlap_param_gather_with_optimizer_step", "parallel.vpp>=2"),
        (["backend.overlap_param_gather_with_optimizer_step=true", "zero.stage=0"],
         "backend.overlap_param_gather_with_optimizer_step", "zero.stage=1"),
        (["backend.fp8_scaling=tensorwise"], "backend.fp8_scaling", "precision=fp8"),
        (["backend.moe_router_fusion=true"], "backend.moe_router_fusion", "dense model"),
        (["backend.fp8_scaling=current"], "backend.fp8_scaling", "delayed"),
        # Transformer Engine runs MXFP8 on compute capability 10.0+ only (Blackwell).
        (["precision=fp8", "backend.fp8_scaling=mxfp8"], "backend.fp8_scaling",
         "backend.fp8_scaling=tensorwise"),
    ],
)  # fmt: skip
def test_megatron_refusals_exit_2_naming_the_key(
    overrides: list[str], key: str, words: str
) -> None:
    result = invoke("validate", *DENSE, *overrides)
    assert result.returncode == 2, shown(result)
    text = " ".join(shown(result).split())
    assert key in text and words in text, text
    assert "Traceback" not in shown(result)


def test_mxfp8_accepted_on_blackwell() -> None:
    on_b200 = [*DENSE, "cluster=b200", "precision=fp8", "backend.fp8_scaling=mxfp8"]
    result = invoke("validate", *on_b200)
    assert result.returncode == 0, shown(result)


def test_torch_refuses_the_megatron_only_keys() -> None:
    base = ["model=llama3-8b", "backend=torch", "cluster=h100-80gb", "train.steps=10"]
    for extra in (
        "backend.cuda_graphs=local",
        "backend.moe_permute_fusion=true",
        "backend.overlap_param_gather_with_optimizer_step=true",
    ):
        result = invoke("validate", *base, extra)
        assert result.returncode == 2, (extra, shown(result))
        assert extra.split("=")[0] in " ".join(shown(result).split())


def test_flags_rendered_as_megatron_lm_spells_them() -> None:
    plain = megatron_args(cfg(*DENSE))
    on = megatron_args(
        cfg(
            *DENSE,
            "precision=fp8",
            "backend.tp_comm_overlap=true",
            "backend.cuda_graphs=transformer_engine",
            "backend.cuda_graph_scope=[attn,mlp]",
            "backend.overlap_param_gather_with_optimizer_step=true",
            "backend.fp8_scaling=tensorwise",
        )
    )
    added = on[len(on) - 13 :]
    assert added == [
        "--tp-comm-overlap",
        "--cuda-graph-impl", "transformer_engine",
        "--cuda-graph-scope", "attn", "mlp",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--overlap-param-gather-with-optimizer-step",
        "--ckpt-format", "torch",
        "--fp8-recipe", "tensorwise",
    ]  # fmt: skip
    for flag in ("--tp-comm-overlap", "--cuda-graph-impl", "--fp8-recipe", "--ckpt-format"):
        assert flag not in plain
    moe = megatron_args(
        cfg(*MOE, "backend.moe_permute_fusion=true", "backend.moe_router_fusion=true")
    )
    assert moe[-2:] == ["--moe-permute-fusion", "--moe-router-fusion"]


def test_current_scaling_adds_one_read_per_fp8_cast() -> None:
    # Per layer and token, forward, the casts read 2 + write 1 bytes of the QKV and FC1 inputs
    # (h each, h = 4096), the projection's input (q_dim / tp = 4096 / 2) and FC2's (f / tp =
    # 14336 / 2): 17,408 elements. Current scaling reads each once more: 2 bytes each; three
    # passes (forward + 2 backward) x the stage's 16 layers x 8192 tokens x bytes_factor / HBM.
    base = [*DENSE, "precision=fp8"]
    delayed = cfg(*base)
    current = cfg(*base, "backend.fp8_scaling=tensorwise")
    hw = hardware_view(delayed)
    d = stage_compute_parts(delayed, derive_layout(delayed), hw, 0)
    c = stage_compute_parts(current, derive_layout(current), hw, 0)
    from launcher.plan.calibration.fitted import constants

    k = constants(hw.arch)
    tokens = delayed.model.seq_length * derive_layout(delayed).micro_batch_size
    elements = 2 * 4096 + 4096 / 2 + 14336 / 2
    layers = derive_layout(delayed).stage_layers[0]
    scale = k.bytes_factor * k.compile_bytes / (hw.hbm_gbps * 1e9)
    expected = tokens * 3 * layers * 2.0 * elements * scale
    assert c.bytes_s - d.bytes_s == pytest.approx(expected, rel=1e-9)
    assert c.linear_s == d.linear_s


def test_cuda_graphs_remove_the_graphed_kernels_launch_gaps() -> None:
    # Whole-layer graphs of a dense layer with tp 2 + sequence parallel, bf16: attention 6 + 2
    # collectives, MLP 5 + 2 = 15 forward kernels, 3 kernels per forward kernel, 0.4 us each.
    plain = cfg(*DENSE)
    graphs = cfg(*DENSE, "backend.cuda_graphs=transformer_engine")
    hw = hardware_view(plain)
    layout = derive_layout(plain)
    p = stage_compute_parts(plain, layout, hw, 0)
    g = stage_compute_parts(graphs, layout, hw, 0)
    layers = layout.stage_layers[0]
    assert p.total_s - g.total_s == pytest.approx(layers * 15 * 3 * KERNEL_GAP_GRAPHED_S)
    # The fusions: 6 routing and 8 permutation kernels per MoE layer go, 0.9 us each.
    moe = cfg(*MOE)
    fused = cfg(*MOE, "backend.moe_router_fusion=true", "backend.moe_permute_fusion=true")
    lay = derive_layout(moe)
    a = stage_compute_parts(moe, lay, hardware_view(moe), 0)
    b = stage_compute_parts(fused, lay, hardware_view(moe), 0)
    assert a.launch_removed_s == 0.0
    assert b.launch_removed_s == pytest.approx(3 * (6 + 8) * KERNEL_GAP_S * 3)
    # ... and the router's fused scores: 2 fp32 passes over 256 experts' scores fewer.
    assert a.bytes_s > b.bytes_s


def test_cuda_graph_static_inputs_per_layer_forward_in_flight() -> None:
    # No pipeline: one micro-batch in flight, so all 32 layer-forwards are, each with one static
    # input of 8192 tokens / tp 2 (sequence parallel) x 4096 x 2 bytes; plus 2 for the gradients.
    one_stage = [
        *DENSE,
        "parallel.pp=1",
        "parallel.vpp=1",
        "parallel.pp_schedule=1f1b",
        "train.micro_batch_size=1",
    ]
    plain = cfg(*one_stage)
    graphs = cfg(*one_stage, "backend.cuda_graphs=transformer_engine")
    layout = derive_layout(plain)
    a, _ = stage_activations(plain, layout, 0)
    b, _ = stage_activations(graphs, layout, 0)
    hidden = 8192 / 2 * 4096 * 2
    assert b - a == pytest.approx(hidden * (32 + 2))
    # Megatron's local full-iteration graph takes token ids as its static input: nothing more.
    full = cfg(*one_stage, "backend.cuda_graphs=local", "backend.cuda_graph_scope=[full_iteration]")
    assert stage_activations(full, layout, 0)[0] == a


def test_param_gather_beside_the_optimizer_step_hides_more() -> None:
    # Llama 3 70B, tp 8 x pp 2 x vpp 2 over 4 nodes, dp 2 across nodes, short sequences: the
    # first forward hides only part of the updated parameters' all-gather. The first model chunk
    # (1 of vpp 2) gathers beside the other chunk's optimizer step: optimizer_s x 1/2 more of it
    # is hidden, each hidden second still costing overlap_cost.
    base = [
        "model=llama3-70b",
        "backend=megatron",
        "cluster=h100-80gb",
        "cluster.num_nodes=4",
        "parallel.tp=8",
        "parallel.pp=2",
        "parallel.vpp=2",
        "parallel.pp_schedule=interleaved",
        "parallel.sequence_parallel=true",
        "zero.stage=1",
        "model.seq_length=1024",
        "train.micro_batch_size=1",
        "train.global_batch_size=8",
        "train.steps=10",
        "precision=bf16",
    ]
    plain = make_plan(cfg(*base))
    over = make_plan(cfg(*base, "backend.overlap_param_gather_with_optimizer_step=true"))
    gather = next(c for c in plain.time.collectives if c.name == "parameter all-gather")
    gather_on = next(c for c in over.time.collectives if c.name == "parameter all-gather")
    from launcher.plan.calibration.fitted import constants

    cost = constants("hopper").overlap_cost
    hidden_more = plain.time.optimizer_s / 2
    assert gather.exposed_s - gather_on.exposed_s == pytest.approx(hidden_more * (1 - cost))
    assert gather_on.time_s == gather.time_s
    assert over.time.step_s < plain.time.step_s


def test_fused_cross_entropy_moves_six_bytes_a_logit_not_thirty() -> None:
    plain = cfg(*DENSE)
    fused = cfg(*DENSE, "backend.cross_entropy_fusion=true")
    hw = hardware_view(plain)
    layout = derive_layout(plain)
    last = layout.pp - 1
    p = stage_compute_parts(plain, layout, hw, last)
    f = stage_compute_parts(fused, layout, hw, last)
    from launcher.plan.calibration.fitted import constants

    k = constants(hw.arch)
    scale = k.bytes_factor * k.compile_bytes / (hw.hbm_gbps * 1e9)
    tokens = layout.micro_batch_size * 8192
    expected = tokens * (30.0 - 6.0) * 128256 / 2 * scale
    assert p.bytes_s - f.bytes_s == pytest.approx(expected, rel=1e-9)


def test_megatron_fsdp_gathers_ahead_and_keeps_gradients_queued() -> None:
    # Llama 3 8B's layer: 218,112,000 parameters. Communication unit max(1e9, 2 x 218M) = 1e9:
    # prefetch 5e8 -> ceil(5e8 / 218.1M) = 3 layers ahead (+1 being computed); the
    # reduce-scatter queue holds floor(1e9 / 218.1M) = 4 layers, +1 enqueued, +1 producing.
    assert whole_units(218_112_000, 32) == (4, 6)
    # Llama 3 70B's layer at tp 1: 855.6M -> unit 1.71e9, prefetch 855.6M: 1 ahead; queue 2.
    assert whole_units(855_654_400, 80) == (2, 4)
    # Never more layers than the stage holds.
    assert whole_units(218_112_000, 2) == (2, 2)
    # A tiny layer: both capped at the 32 layers there are.
    b = megatron_fsdp_buffers(1000.0, 32, weight_bytes=2.0, grad_bytes=4.0)
    assert b == 1000.0 * (32 * 2.0 + 32 * 4.0)
    # In the plan: backend=megatron zero.stage=3 counts these, torch's FSDP the generic two
    # layers and one layer's gradients.
    mega = cfg("model=llama3-8b", "backend=megatron", "zero.stage=3", "cluster=h100-80gb",
               "train.steps=10", "precision=bf16")  # fmt: skip
    layer = 218_112_000
    # 4 layers of bf16 weights and 6 of gradients, fp32 (precision.grad_dtype's default).
    assert stage_buffers(mega, derive_layout(mega)) == pytest.approx(layer * (4 * 2 + 6 * 4))
