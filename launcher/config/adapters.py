"""The projections LoRA can adapt, written once for every reader: the words of
``finetune.targets``, the module each names in llmtrain's model
(launcher/train/model/transformer.py), its Hugging Face Llama name (the PEFT export,
launcher/export/hf_layout.py's _llama_names) and how tensor parallel splits it; and the NF4
block sizes QLoRA's base weights come in. Plain data, no torch: plan/ prices the adapters,
validate/ words the rules, train/ builds and exports them, all from here.

| target | module in the block | HF name   | tensor parallel | note                          |
|--------|---------------------|-----------|-----------------|-------------------------------|
| q      | attention.wq        | q_proj    | column          |                               |
| k      | attention.wk        | k_proj    | column          |                               |
| v      | attention.wv        | v_proj    | column          |                               |
| o      | attention.wo        | o_proj    | row             |                               |
| gate   | feed_forward.w1     | gate_proj | column          | swiglu MLP only               |
| up     | feed_forward.w3     | up_proj   | column          | w1 in a GELU MLP (no gate)    |
| down   | feed_forward.w2     | down_proj | row             |                               |

The model has no fused qkv projection. ``all-linear`` adapts every projection the model has.
"""

from __future__ import annotations

from launcher.config.schema.finetune import ALL_LINEAR as ALL_LINEAR  # re-exported

ATTENTION_MODULES = {"q": "wq", "k": "wk", "v": "wv", "o": "wo"}
# Every word finetune.targets takes, in the order messages list them.
TARGET_WORDS = (*ATTENTION_MODULES, "gate", "up", "down", ALL_LINEAR)
# Split column-wise under tensor parallel (the rest, o and down, row-wise).
COLUMN_PARALLEL = ("q", "k", "v", "gate", "up")
# Our projection module -> Hugging Face Llama's.
HF_NAMES = {
    "wq": "q_proj",
    "wk": "k_proj",
    "wv": "v_proj",
    "wo": "o_proj",
    "w1": "gate_proj",
    "w3": "up_proj",
    "w2": "down_proj",
}
# torchao NF4Tensor: block_size 64 weights, scaler_block_size 256 scalers
# (torchao/quantization/quantize_/workflows/nf4/nf4_tensor.py, to_nf4's defaults).
NF4_BLOCK, NF4_SCALER_BLOCK = 64, 256


def mlp_modules(activation: str) -> dict[str, str]:
    """The MLP's targets and module names: gate/up/down with swiglu, up/down with GELU."""
    if activation == "swiglu":
        return {"gate": "w1", "up": "w3", "down": "w2"}
    return {"up": "w1", "down": "w2"}


def target_modules(activation: str) -> dict[str, str]:
    """{target: module path in a block} of every projection a model with this MLP has."""
    out = {k: f"attention.{v}" for k, v in ATTENTION_MODULES.items()}
    out.update({k: f"feed_forward.{v}" for k, v in mlp_modules(activation).items()})
    return out
