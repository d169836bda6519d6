"""train.init_from reads a Hugging Face folder slice by slice: each rank asks for the boxes it
holds (``launcher.train.build``) and gets those values alone, from one safetensors file or an
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

from launcher.config.compose import compose_config  # noqa: E402
from launcher.export.hf_layout import hf_renames  # noqa: E402
from launcher.train.build import Chain, Filler, drawn, region  # noqa: E402
from launcher.train.init_from import HFSlices, InitFromError, open_source  # noqa: E402
from launcher.train.model import build_model  # noqa: E402

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
