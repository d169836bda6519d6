"""`llmtrain export RUN_DIR --format hf --out DIR`: a checkpoint as a Hugging Face model folder.

Steps: the run's own config.yaml gives the model; the newest checkpoint that verifies (or the one
of ``--step``, refused with the reason when it does not verify: damaged, or unsigned while
``LLMTRAIN_CHECKPOINT_KEY`` is set) is read tensor by tensor (``gather``: DCP shards and DeepSpeed
files alike, each tensor read on its own where it lies; every file checked against the manifest
as it is read: ``safe_load.CheckpointFiles``), its shapes checked against those config.yaml's
model gives before anything is read (config.json is written from it: a mismatch is refused),
mapped to the HF layout its shape has (``hf_layout.hf_recipes``: Llama, Mixtral or GPT-2;
anything else refused with the keys that make it so) one HF tensor at a time and written with
``hf_files.write_hf_folder`` (``safetensors_stream``: each tensor written as it is made) into a
temporary sibling, then put in place by ``launcher.outputs`` (its marker, no replacing of what
appeared meanwhile; --overwrite replaces only an earlier export): safetensors shards + index,
config.json, generation_config.json and the tokenizer.

Tokenizer: the run's prepared data folder names it in index.json. A ``tokenizer.json`` there (a
user's own, or the BPE trained by ``data prepare``) is copied, with the named special tokens and
chat template of the folder's tokenizer_config.json; the byte tokenizer is written as an
equivalent tokenizer.json (``byte_tokenizer``) with the special ids its data used: <|endoftext|>
256 where index.json names that end-of-document id, none for older byte data and the built-in
corpus; data.builtin=chat gets its own byte + ChatML tokenizer (``chat.builtin_chat``).
tokenizer_config.json, special_tokens_map.json, config.json and generation_config.json name the
same bos/eos/pad (``special_tokens``). transformers is never imported.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher import bounded_read
from launcher.config.run_config import read_run_config
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.excerpt import name as shown
from launcher.rundir import RunDir, step_dir_name

GENERATION_CONFIG = "generation_config.json"
# The byte tokenizer's end-of-document token: id 256, one past the bytes, as `llmtrain data
# prepare` appends it (launcher.data.tokenizer.ByteTokenizer), named as the BPE's EOD_TOKEN.
BYTE_EOD_ID = 256
EOD_TOKEN = "<|endoftext|>"
COMMAND = "llmtrain export"  # names the outputs marker's writer (launcher.outputs)


@dataclass(frozen=True)
class ExportResult:
    out: Path
    step: int
    checkpoint: Path
    architecture: str
    parameters: int
    tokenizer: str
    files: list[str] = field(default_factory=list)
    gathered: str = ""  # what was held at once (launcher.train.checkpoint.gather)

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "step": self.step,
            "checkpoint": str(self.checkpoint),
            "architecture": self.architecture,
            "parameters": self.parameters,
            "tokenizer": self.tokenizer,
            "files": self.files,
            "gathered": self.gathered,
        }


def run_config(run_dir: Path) -> LLMTrainConfig:
    """The run's config.yaml; keys added to llmtrain since the run was made take defaults, keys
    removed since are ignored (export reads the model only; see launcher.config.run_config)."""
    path = RunDir(run_dir).config
    if not path.is_file():
        raise UserError(f"{run_dir}: no config.yaml; is it a run directory (runs/NAME-HASH)?")
    try:
        return read_run_config(path).config
    except (KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a config.yaml this llmtrain reads ({exc})") from None


def pick_checkpoint(run_dir: Path, step: int | None) -> tuple[int, Path]:
    """(step, folder) of the checkpoint to read: `step`'s, or the newest that verifies."""
    from launcher.train.checkpoint.store import (
        KEY_ENV,
        complete_checkpoints,
        valid_checkpoints,
        verify,
    )

    root = RunDir(run_dir).checkpoints
    if step is not None:
        path = root / step_dir_name(step)
        if not path.is_dir() or path.is_symlink():
            have = ", ".join(str(s) for s, _ in complete_checkpoints(root)[:5]) or "none"
            raise UserError(f"--step {step}: no checkpoint {path} (steps here: {have})")
        problem = verify(path)
        if problem is not None:
            raise UserError(
                f"--step {step}: checkpoint {path} refused: {problem}"
                + (f" (is {KEY_ENV} the run's key?)" if "sign" in problem else "")
            )
        return step, path
    found = next(valid_checkpoints(root), None)
    if found is None:
        count = len(complete_checkpoints(root))
        raise UserError(
            f"{run_dir}: no checkpoint verifies ({count} folder(s) in {root}); train it first "
            f"with `llmtrain run`, or pass --step N of a good one"
        )
    return found.step, found.path


ROLES = ("bos", "eos", "pad")


@dataclass(frozen=True)
class TokenizerFiles:
    """The exported tokenizer: {file name: bytes} (tokenizer.json), what it is, the data's
    end-of-document id, and the data's own tokenizer_config.json entries (its named special
    tokens and chat template; {} where it has none)."""

    files: dict[str, bytes]
    description: str
    eod_id: int | None
    data_config: dict[str, Any] = field(default_factory=dict)


def _token_name(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken object."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _added_tokens(files: dict[str, bytes]) -> dict[str, int]:
    """{content: id} of the added tokens of the exported tokenizer.json."""
    try:
        document = json.loads(files["tokenizer.json"])
    except (KeyError, ValueError):
        return {}
    added = document.get("added_tokens") if isinstance(document, dict) else None
    return {
        t["content"]: t["id"]
        for t in (added if isinstance(added, list) else [])
        if isinstance(t, dict) and isinstance(t.get("content"), str) and type(t.get("id")) is int
    }


def special_tokens(
    files: dict[str, bytes], eod_id: int | None, data_config: dict[str, Any] | None = None
) -> dict[str, tuple[str, int]]:
    """{role: (token, id)} for bos, eos and pad, each an added token of the tokenizer.json. The
    data's end-of-document token ends each document, so it is the model's eos; with no
    beginning-of-document token it is also bos (GPT-2's convention), and pad (nothing is padded in
    pre-training; generate() wants one). A role the data's tokenizer_config.json names is that
    token instead: a chat model's eos is its turn end (ChatML's <|im_end|>, Llama 3's <|eot_id|>),
    the token its answers end with."""
    added = _added_tokens(files)
    by_id = {i: name for name, i in added.items()}
    roles = {r: (by_id[eod_id], eod_id) for r in ROLES} if eod_id in by_id else {}
    for role in ROLES:
        name = _token_name((data_config or {}).get(f"{role}_token"))
        if name is not None and name in added:
            roles[role] = (name, added[name])
    return roles


def special_ids(
    eod_id: int | None, vocab_size: int, tokens: dict[str, tuple[str, int]] | None = None
) -> dict[str, int | None]:
    """bos/eos/pad ids for config.json and generation_config.json: those of `tokens`
    (``special_tokens``), else the end-of-document id for all three. Written out even when None:
    transformers' own defaults (GPT-2's 50256) would otherwise name an id outside a small
    vocabulary."""
    ids: dict[str, int | None] = {}
    for role in ROLES:
        token_id = tokens[role][1] if tokens and role in tokens else eod_id
        ok = token_id is not None and 0 <= token_id < vocab_size
        ids[f"{role}_token_id"] = token_id if ok else None
    return ids


def generation_ids(
    eod_id: int | None, vocab_size: int, tokens: dict[str, tuple[str, int]] | None = None
) -> dict[str, int | list[int] | None]:
    """generation_config.json's ids: ``special_ids``, with generation stopping at the
    end-of-document token too where eos is another (a chat model's turn end): a list, as
    transformers' GenerationConfig takes it."""
    ids: dict[str, int | list[int] | None] = {**special_ids(eod_id, vocab_size, tokens)}
    eos, eod = ids["eos_token_id"], special_ids(eod_id, vocab_size)["eos_token_id"]
    if isinstance(eos, int) and eod is not None and eod != eos:
        ids["eos_token_id"] = [eos, eod]
    return ids


def tokenizer_extras(
    files: dict[str, bytes],
    eod_id: int | None,
    seq_length: int,
    data_config: dict[str, Any] | None = None,
) -> dict[str, bytes]:
    """tokenizer_config.json and special_tokens_map.json for the exported tokenizer.json, so
    AutoTokenizer loads it as the fast tokenizer it is (not the architecture's own class, which
    would add a <s> that is not in the vocabulary) with its special tokens named
    (``special_tokens``) and the data's chat template, where it has one."""
    if "tokenizer.json" not in files:
        return {}
    tokens = special_tokens(files, eod_id, data_config)
    special = {f"{role}_token": name for role, (name, _) in tokens.items()}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": seq_length,
        "clean_up_tokenization_spaces": False,
        **special,
    }
    template = (data_config or {}).get("chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    return {
        "tokenizer_config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
        "special_tokens_map.json": (json.dumps(special, indent=2, sort_keys=True) + "\n").encode(),
    }


def _byte_tokenizer(specials: tuple[str, ...]) -> dict[str, bytes]:
    from launcher.export.byte_tokenizer import write_byte_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        write_byte_tokenizer(path, specials)
        return {"tokenizer.json": path.read_bytes()}


def _builtin_chat_tokenizer() -> TokenizerFiles:
    """data.builtin=chat: the tokenizer its data is made with (``launcher.data.chat.builtin_chat``:
    the bytes, then <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258; ChatML), written again
    here (it is generated, the same on every machine) rather than read from a cache."""
    from launcher.data.chat.builtin_chat import SPECIALS, write_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        path = write_tokenizer(Path(tmp))
        files = {"tokenizer.json": path.read_bytes()}
        data_config = json.loads((Path(tmp) / "tokenizer_config.json").read_text("utf-8"))
    eod_id = 256 + SPECIALS.index(EOD_TOKEN)
    return TokenizerFiles(files, "byte + ChatML specials (data.builtin=chat)", eod_id, data_config)


def _data_tokenizer_config(folder: Path) -> dict[str, Any]:
    """The prepared data's tokenizer_config.json ({} where absent or unreadable)."""
    try:
        config = bounded_read.read_json(folder / "tokenizer_config.json", max_bytes=1 << 20)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def tokenizer_files(cfg: LLMTrainConfig) -> TokenizerFiles:
    """The run's tokenizer, named by its prepared data (index.json), or the built-in data's."""
    if cfg.data.path is None:
        if cfg.data.builtin in ("chat", "preference"):  # the same byte-level ChatML tokenizer
            return _builtin_chat_tokenizer()
        # The built-in corpus: bytes, no end-of-document token.
        return TokenizerFiles(_byte_tokenizer(()), "byte (as tokenizer.json)", None)
    folder = Path(cfg.data.path).expanduser()
    try:
        index = bounded_read.read_json(folder / "index.json", max_bytes=1 << 20)
        if not isinstance(index, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError):
        return TokenizerFiles({}, f"none written: {folder}/index.json is unreadable", None)
    kind = shown(str(index.get("tokenizer")), 40)
    eod = index.get("eod_id")
    eod_id = eod if type(eod) is int else None
    if kind == "byte":
        # As the data is read back (prepare.tokenizer_from_index): id 256 ends each document
        # where index.json says so (`data prepare` since byte EOD); older byte data has none.
        if eod_id != BYTE_EOD_ID:
            return TokenizerFiles(_byte_tokenizer(()), "byte (as tokenizer.json)", None)
        files = _byte_tokenizer((EOD_TOKEN,))
        return TokenizerFiles(files, f"byte + {EOD_TOKEN} {eod_id} (as tokenizer.json)", eod_id)
    name = str(index.get("tokenizer_file") or "tokenizer.json")
    source = folder / name
    if Path(name).name != name or source.is_symlink() or not source.is_file():
        return TokenizerFiles({}, f"none written: {source} is missing", eod_id)
    files = {"tokenizer.json": source.read_bytes()}
    return TokenizerFiles(files, f"{kind} ({source})", eod_id, _data_tokenizer_config(folder))


def export_hf(
    run_dir: Path,
    out: Path,
    step: int | None = None,
    overwrite: bool = False,
    max_shard_bytes: int | None = None,
    adapter: bool = False,
) -> ExportResult:
    """Export `run_dir`'s checkpoint to the Hugging Face folder `out` (see the module docstring);
    a finetune=lora|qlora run's adapters merged into its base, or with `adapter` the adapters
    alone as a PEFT folder (``launcher.train.finetune.lora_export``). The weights are read and
    written one tensor at a time (``gather``), whatever the engine."""
    from launcher import outputs
    from launcher.export.hf_files import DEFAULT_SHARD_BYTES, write_hf_folder
    from launcher.export.hf_layout import LayoutError, hf_architecture
    from launcher.train.checkpoint import gather
    from launcher.train.checkpoint.consolidate import ConsolidateError
    from launcher.train.checkpoint.safe_load import CheckpointFiles, UnsafeCheckpointError

    run_dir, out = Path(run_dir), Path(out)
    found = outputs.check_target(out, "--out", COMMAND, overwrite, "a model folder")
    cfg = run_config(run_dir)
    try:
        architecture = hf_architecture(cfg.model)
    except LayoutError as exc:
        raise UserError(f"{run_dir}: {exc}") from None
    step_done, checkpoint = pick_checkpoint(run_dir, step)
    try:
        # Each file checked against the manifest as it is read (safe_load.CheckpointFiles).
        files = CheckpointFiles.verified(checkpoint)
        model = gather.open_checkpoint(checkpoint / "engine", cfg.model.num_layers, files)
    except (ConsolidateError, UnsafeCheckpointError, KeyError) as exc:
        raise UserError(f"{checkpoint}: cannot be exported: {exc}") from None
    if adapter:
        return _export_adapter(cfg, model, checkpoint, step_done, out, found, run_dir)
    if cfg.finetune.name != "full":  # adapters only: merged into the base they were trained on
        model = gather.merged(cfg, model, checkpoint / "engine", files)
    stream = _hf_stream(cfg, model, checkpoint, run_dir)
    tok = tokenizer_files(cfg)
    extra, vocab = dict(tok.files), cfg.model.vocab_size
    tokens = special_tokens(extra, tok.eod_id, tok.data_config)
    from launcher.export.hf_layout import hf_config

    dtype = stream.specs[0].dtype
    config = hf_config(cfg.model, torch_dtype=str(dtype).removeprefix("torch."))
    config.update(special_ids(tok.eod_id, vocab, tokens))
    extra.update(tokenizer_extras(extra, tok.eod_id, cfg.model.seq_length, tok.data_config))
    generation = generation_ids(tok.eod_id, vocab, tokens)
    extra[GENERATION_CONFIG] = (json.dumps(generation, indent=2, sort_keys=True) + "\n").encode()
    metadata = {"llmtrain_run": run_dir.name, "llmtrain_step": str(step_done)}

    def write(folder: Path) -> None:
        try:
            write_hf_folder(
                folder,
                stream,
                config,
                max_shard_bytes=max_shard_bytes or DEFAULT_SHARD_BYTES,
                metadata=metadata,
                extra_files=extra,
            )
        except (ConsolidateError, UnsafeCheckpointError) as exc:
            raise UserError(f"{checkpoint}: cannot be exported: {exc}") from None
        model.check()  # a LoRA base's digest: refused here, nothing is put in place

    _install_staged(write, out, found, run_dir, step_done)
    return ExportResult(
        out=out,
        step=step_done,
        checkpoint=checkpoint,
        architecture=architecture,
        parameters=sum(math.prod(s.shape) for s in stream.specs),
        tokenizer=tok.description,
        files=sorted(p.name for p in out.iterdir()),
        gathered=model.how(stream.largest),
    )


def _hf_stream(cfg: LLMTrainConfig, model: Any, checkpoint: Path, run_dir: Path) -> Any:
    """The HF tensors of `model` (``gather.ModelTensors``) announced from the shapes alone and
    made one at a time (``hf_layout.hf_recipes``); a model whose tensors do not have the shapes
    config.yaml gives (config.json is written from it) is refused before anything is read."""
    import torch

    from launcher.export.hf_layout import LayoutError, hf_recipes
    from launcher.export.safetensors_stream import Spec, Streamed
    from launcher.train.checkpoint.init_from import expected_shapes, mismatches

    have = {k: shape for k, (shape, _) in model.specs.items()}
    misfits = mismatches(have, expected_shapes(cfg.model))
    if misfits:
        shown = misfits[:5] + ([f"... and {len(misfits) - 5} more"] if len(misfits) > 5 else [])
        raise UserError(
            f"{checkpoint}: its weights do not fit the model of {RunDir(run_dir).config} (from "
            "which config.json would be written): " + "; ".join(shown) + ". Was config.yaml "
            "changed after the checkpoint was written? Nothing was exported"
        )
    recipes = hf_recipes(cfg.model)
    specs = []
    try:
        for name, recipe in recipes.items():
            meta = [
                torch.empty(model.specs[k][0], dtype=model.specs[k][1], device="meta")
                for k in recipe.inputs
            ]
            made = recipe.make(meta)
            specs.append(Spec(name, made.dtype, tuple(made.shape)))
    except (LayoutError, KeyError, RuntimeError) as exc:
        raise UserError(f"{checkpoint}: cannot be exported: {exc}") from None

    def make(name: str) -> Any:
        recipe = recipes[name]
        return recipe.make([model.tensor(k) for k in recipe.inputs])

    return Streamed(specs, make)


def _export_adapter(
    cfg: LLMTrainConfig,
    model: Any,
    checkpoint: Path,
    step_done: int,
    out: Path,
    found: Any,
    run_dir: Path,
) -> ExportResult:
    """`--adapter`: the adapters alone as a PEFT folder (launcher.train.finetune.lora_export)."""
    from launcher.export.hf_layout import hf_architecture
    from launcher.train.checkpoint import gather
    from launcher.train.finetune import lora_export

    if cfg.finetune.name == "full":
        raise UserError(
            f"--adapter: {run_dir} trained every weight (finetune=full); export it without "
            "--adapter"
        )
    architecture = hf_architecture(cfg.model)
    if architecture != "LlamaForCausalLM":
        raise UserError(
            f"--adapter: PEFT adapters are written for the Llama layout (this model exports as "
            f"{architecture}, whose fused projections take other adapter shapes); export the "
            "merged model without --adapter"
        )
    adapters = gather.adapters(model, checkpoint)
    tok = tokenizer_files(cfg)
    extra = dict(tok.files)
    extra.update(tokenizer_extras(extra, tok.eod_id, cfg.model.seq_length, tok.data_config))
    source = lora_export.base_run(cfg)  # an llmtrain run: exported beside, as DIR/base

    def write(folder: Path) -> None:
        base = str(out.expanduser().resolve() / "base") if source is not None else None
        lora_export.write_adapter_folder(folder, cfg, adapters, base, extra)
        if source is not None:
            export_hf(source[0], folder / "base", step=source[1])

    _install_staged(write, out, found, run_dir, step_done)
    size = sum(v.numel() * v.element_size() for v in adapters.values())
    return ExportResult(
        out=out,
        step=step_done,
        checkpoint=checkpoint,
        architecture="PEFT LoRA adapter for " + architecture,
        parameters=sum(int(v.numel()) for v in adapters.values()),
        tokenizer=tok.description,
        files=sorted(p.name for p in out.iterdir()),
        gathered=f"the adapters alone read ({gather.mib(size)}); the base is not read",
    )


def _install_staged(
    write: Callable[[Path], object], out: Path, found: str, run_dir: Path, step_done: int
) -> None:
    """`write` a folder beside `out`, then rename it into place without replacing anything that
    appeared meanwhile; --overwrite replaces only an earlier export (launcher.outputs)."""
    from launcher import outputs

    staging = outputs.temporary_sibling(out)
    try:
        write(staging / "export")
        outputs.install(
            staging / "export",
            out,
            "--out",
            COMMAND,
            found,
            extra={"run": str(run_dir.resolve()), "step": step_done},
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
