"""What a configuration asks of chat data that the data or the layout cannot give, checked
before launch (``launcher.launch.preflight.data_problems``): each problem names the key, the rule
and a value that works. Reads the data's metadata and roles (numpy, no torch)."""

from __future__ import annotations

from typing import Any

from launcher.errors import UserError


def layout_problems(pp: int, cp: int, packing: bool) -> list[str]:
    """Packed examples need their document mask inside every attention layer: the pipeline
    stages after the first receive hidden states only, and ring attention has no mask."""
    out = []
    if packing and pp > 1:
        out.append(
            f"data.packing=true with parallel.pp={pp}: packed examples need their document mask "
            "in every pipeline stage, which the stages after the first do not receive; set "
            "data.packing=false (one example a row, padded) or parallel.pp=1"
        )
    if packing and cp > 1:
        out.append(
            f"data.packing=true with parallel.cp={cp}: ring attention applies no document mask; "
            "set data.packing=false or parallel.cp=1"
        )
    return out


def chat_problems(cfg: Any, global_batch: int, pp: int, cp: int) -> list[str]:
    """Problems of a chat dataset named by data.path for `cfg` (data.builtin=chat is checked by
    the validation rule ``chat-data``)."""
    from launcher.data.sources import describe

    d = cfg.data
    if d.path is None:
        return []
    try:
        info = describe(d.path, "data.path")
    except UserError:
        return []  # source_problems says it
    if info.chat is None:
        if cfg.finetune.objective != "sft":
            return [objective_problem(cfg, d.path, pairs=False)]
        return []
    from launcher.data.chat.preference_rows import is_preference_index, packing_message

    pairs = is_preference_index(info.chat)
    if pairs != (cfg.finetune.objective != "sft"):
        return [objective_problem(cfg, d.path, pairs)]
    if pairs and d.packing:
        return [packing_message(f"data.path={d.path} (preference pairs)")]
    out = layout_problems(pp, cp, d.packing)
    if out:
        return out
    rows = open_chat_rows(info, "train", cfg)
    if rows.num_sequences(cfg.model.seq_length) < global_batch:  # rows, or pairs
        out.append(
            f"data.path={d.path}: {rows.report.line()}; fewer rows than one global batch "
            f"({global_batch}): lower train.global_batch_size, or set data.packing=true"
        )
    return out


def objective_problem(cfg: Any, path: str, pairs: bool) -> str:
    """The data and finetune.objective disagree: pairs for sft, or other data for dpo."""
    objective = cfg.finetune.objective
    if pairs:
        return (
            f"data.path={path} holds preference pairs (prompt, chosen, rejected), which "
            f"finetune.objective={objective} does not train on: finetune.objective=dpo (or simpo, "
            "orpo)"
        )
    return (
        f"finetune.objective={objective} trains on preference pairs; data.path={path} holds none: "
        "prepare them with `llmtrain data prepare --input-format preference`, or "
        "data.builtin=preference"
    )


def open_chat_rows(info: Any, split: str, cfg: Any) -> Any:
    """The rows of one split of a described chat dataset, as the run reads them."""
    from launcher.data.chat.preference_rows import PreferenceRows, is_preference_index
    from launcher.data.megatron_indexed import IndexedDataset
    from launcher.data.packing import ChatRows

    tokens_prefix = info.valid_prefix if split == "valid" else info.train_prefix
    roles_prefix = info.valid_roles if split == "valid" else info.train_roles
    if tokens_prefix is None or roles_prefix is None:
        raise UserError(f"{info.key}={info.path}: no {split} split")
    try:
        tokens = IndexedDataset.open(tokens_prefix)
        roles = IndexedDataset.open(roles_prefix)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(f"{info.key}={info.path}: {exc}") from None
    if not (tokens.sizes.shape == roles.sizes.shape and (tokens.sizes == roles.sizes).all()):
        raise UserError(
            f"{info.key}={info.path}: its tokens and loss roles disagree in length; prepare the "
            "data again (llmtrain data prepare ... --overwrite)"
        )
    d = cfg.data
    pad = int(info.chat.get("pad_id", 0)) if info.chat else 0
    if is_preference_index(info.chat):
        return PreferenceRows(tokens, roles, cfg.model.seq_length, d.overlong, pad)
    return ChatRows(tokens, roles, cfg.model.seq_length, d.packing, d.overlong, d.train_on, pad)
