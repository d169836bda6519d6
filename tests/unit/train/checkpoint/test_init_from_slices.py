"""train.init_from reads a Hugging Face folder slice by slice: each rank asks for the boxes it
holds (``train.parallel.build``) and gets those values alone, from one safetensors file or an
index-sharded folder, in the file's dtype (converted per slice when filled); a model that does
not fit is refused from the headers before anything is read."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import save_file  # noqa: E402

from launcher.config.composition.compose import compose_config  # noqa: E402
from launcher.export.hf_layout import hf_renames  # noqa: E402
from launcher.train.checkpoint.init_from import HFSlices, InitFromError, open_source  # noqa: E402
from launcher.train.model.transformer import build_model  # noqa: E402
from launcher.train.parallel.build import Chain, Filler, drawn, region  # noqa: E402

pytestmark = pytest.mark.unit

LLAMA = [
    "recipe=tiny",
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.ffn_hidden_size=128",
    "model.num_attention_heads=4",
    "model.norm=rmsnorm",
    "model.position=rope",
    "model.activation=swiglu",
    "model.tie_embeddings=false",
]


def _export(folder: Path, sharded: bool, seed: int = 3) -> tuple[object, dict[str, object]]:
    """A Hugging Face folder of a drawn model (bf16, as exports of bf16 runs are)."""
    cfg = compose_config(LLAMA).config
    model = build_model(cfg.model, "cpu", seed=seed)
    renames = hf_renames(cfg.model)
    assert renames is not None
    theirs = {renames[k]: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    if not sharded:
        save_file(theirs, str(folder / "model.safetensors"))
    else:
        names = sorted(theirs)
        halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
        weight_map = {}
        for file, keys in halves.items():
            save_file({k: theirs[k] for k in keys}, str(folder / file))
            weight_map.update(dict.fromkeys(keys, file))
        index = {"weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return cfg, {k: v for k, v in model.state_dict().items()}


@pytest.mark.parametrize("sharded", [False, True])
def test_a_box_reads_its_slice_alone(tmp_path: Path, sharded: bool) -> None:
    cfg, state = _export(tmp_path / "hf", sharded)
    renames = hf_renames(cfg.model)  # type: ignore[attr-defined]
    source = HFSlices(tmp_path / "hf", renames)
    name = "layers.1.feed_forward.w2.weight"  # [64, 128]
    box = source.box(name, (16, 32), (8, 64))
    assert box.dtype == torch.bfloat16 and tuple(box.shape) == (8, 64)
    assert torch.equal(box, state[name][16:24, 32:96].to(torch.bfloat16))
    # A LoRA-wrapped base asks under its own name.
    assert source.has("layers.1.attention.wq.base.weight")
    assert not source.has("layers.1.attention.wq.lora_a.weight")


def test_a_filled_model_holds_the_export(tmp_path: Path) -> None:
    cfg, state = _export(tmp_path / "hf", sharded=True)
    model = build_model(cfg.model, "meta")  # type: ignore[attr-defined]
    model.to_empty(device="cpu")
    source = HFSlices(tmp_path / "hf", hf_renames(cfg.model))  # type: ignore[attr-defined]
    Filler(Chain(source, drawn(model, 0))).fill_module(model)
    for name, param in model.named_parameters():
        assert torch.equal(param, state[name].to(torch.bfloat16).float()), name
        assert region(param).offsets == (0,) * param.dim()


def test_a_folder_of_another_shape_is_refused_before_reading(tmp_path: Path) -> None:
    _export(tmp_path / "hf", sharded=False)
    cfg = compose_config([*LLAMA, "model.hidden_size=128"]).config
    cfg = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, init_from=str(tmp_path / "hf"))
    )
    with pytest.raises(InitFromError, match="does not fit the model"):
        open_source(cfg)


def test_slices_are_read_without_mapping_the_file(tmp_path: Path) -> None:
    """Mapped pages a rank touches count in its resident set (issue #39's bench: ~2x the plan):
    the boxes and digests are read with plain file reads, the file never mapped."""
    cfg, state = _export(tmp_path / "hf", sharded=False)
    source = HFSlices(tmp_path / "hf", hf_renames(cfg.model))  # type: ignore[attr-defined]
    name = "layers.0.feed_forward.w1.weight"
    assert torch.equal(source.box(name, (0, 0), (8, 64)), state[name][:8].to(torch.bfloat16))
    maps = Path("/proc/self/maps").read_text()
    assert str(tmp_path / "hf" / "model.safetensors") not in maps
    digest = source.digest(name)
    # The digest of the whole tensor, as lora.base_digest takes it from the values in fp32.
    from launcher.train.finetune.lora import base_digest

    whole = state[name].to(torch.bfloat16).float()
    assert digest == base_digest({name: whole})[name]


def test_every_box_of_every_rank_reads_back_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Boxes of 1-, 2- and 3-d tensors and a scalar, at every offset and extent, in two dtypes;
    digests read in chunks of rows smaller than the tensor."""
    import itertools

    from launcher.train.checkpoint import safetensors_slices as slices

    g = torch.Generator().manual_seed(0)
    tensors = {
        "a": torch.randn(6, 5, generator=g),
        "b": torch.randn(3, 4, 5, generator=g).to(torch.bfloat16),
        "c": torch.tensor(3.0),
        "e": torch.randn(7, generator=g),
    }
    save_file(tensors, str(tmp_path / "m.safetensors"))
    header = slices.read_header(tmp_path / "m.safetensors")
    for name, x in tensors.items():
        dims = tuple(x.shape)
        for offsets in itertools.product(*[range(n) for n in dims]):
            for shape in itertools.product(
                *[range(1, n - o + 1) for n, o in zip(dims, offsets, strict=True)]
            ):
                got = slices.read_box(header[name], offsets, shape)
                want = x[tuple(slice(o, o + n) for o, n in zip(offsets, shape, strict=True))]
                assert torch.equal(got, want), (name, offsets, shape)
    from launcher.train.finetune.lora import base_digest

    monkeypatch.setattr(slices, "CHUNK_BYTES", 80)  # one row of b (4 x 5 fp32) a read
    for name, x in tensors.items():
        assert slices.fp32_digest(header[name]) == base_digest({name: x.float()})[name], name


@pytest.mark.parametrize("bias", [True, False])
def test_a_gpt2_folder_is_read_by_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bias: bool
) -> None:
    """GPT-2's q/k/v are fused and transposed in c_attn: a box of ours is a box of theirs, read
    alone; digests by rows of ours equal the whole tensor's (before: read whole, per rank)."""
    from launcher.export.hf_files import write_hf_folder
    from launcher.export.hf_layout import hf_architecture, to_hf
    from launcher.train.checkpoint import safetensors_slices as slices
    from launcher.train.finetune.lora import base_digest

    gpt2 = ["recipe=tiny", "model.num_layers=2", "model.hidden_size=64",
            "model.ffn_hidden_size=128", "model.num_attention_heads=4",
            f"model.linear_bias={str(bias).lower()}"]  # fmt: skip
    cfg = compose_config([*gpt2, f"train.init_from={tmp_path / 'hf'}"]).config
    assert hf_architecture(cfg.model) == "GPT2LMHeadModel"
    state = build_model(cfg.model, "cpu", seed=5).state_dict()
    write_hf_folder(tmp_path / "hf", to_hf(state, cfg.model), {})
    source = open_source(cfg)
    assert isinstance(source, HFSlices)
    monkeypatch.setattr(slices, "CHUNK_BYTES", 3 * 64 * 4)  # three rows of a [*, 64] tensor
    for name, whole in state.items():
        offsets = tuple(n // 4 for n in whole.shape)
        shape = tuple(n - n // 4 - n // 8 for n in whole.shape)
        index = tuple(slice(o, o + n) for o, n in zip(offsets, shape, strict=True))
        assert torch.equal(source.box(name, offsets, shape), whole[index]), name
        assert source.digest(name) == base_digest({name: whole})[name], name


def test_a_file_swapped_for_a_fifo_after_its_header_is_refused_not_waited_on(
    tmp_path: Path,
) -> None:
    """The headers are read when the source opens, the boxes later, during the build: a file
    swapped for a FIFO in between (no writer ever comes) is refused by name, not blocked on."""
    import os
    import signal

    from launcher.bounded_read import FileRefused

    cfg, _ = _export(tmp_path / "hf", sharded=False)
    source = HFSlices(tmp_path / "hf", hf_renames(cfg.model))  # type: ignore[attr-defined]
    weights = tmp_path / "hf" / "model.safetensors"
    weights.unlink()
    os.mkfifo(weights)

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("the box read blocked on the FIFO")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        with pytest.raises(FileRefused, match=r"model\.safetensors is a FIFO"):
            source.box("layers.0.feed_forward.w1.weight", (0, 0), (8, 64))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
