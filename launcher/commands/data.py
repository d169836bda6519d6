"""`data prepare`: tokenize text, JSON Lines, parquet or saved datasets (and chat or instruct
records) into a train and a validation split that `data.path=` reads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from launcher.commands.common import JsonFlag, err, out, print_json
from launcher.errors import UserError

data_app = typer.Typer(
    help="Prepare training data: tokenize text, JSON Lines, parquet or saved datasets into shards."
)

Inputs = Annotated[
    list[str],
    typer.Option(
        "--input",
        "-i",
        help="File or folder (repeatable); chat, instruct and preference records also from "
        "parquet, datasets.save_to_disk folders and dataset ids in the local HF cache.",
    ),
]
Split = Annotated[
    str,
    typer.Option(
        "--split", help="Split of a dataset id or a saved DatasetDict folder (records only)."
    ),
]
Columns = Annotated[
    list[str] | None,
    typer.Option(
        "--columns",
        help="TARGET=SOURCE: read the field TARGET (messages, prompt, chosen, ...) from the "
        "column SOURCE (repeatable), e.g. --columns messages=conversation.",
    ),
]
Output = Annotated[str, typer.Option("--output", "-o", help="Folder to write shards into.")]
Tokenizer = Annotated[
    str,
    typer.Option(
        help="byte (default), bpe (trained here), or the path of a Hugging Face tokenizer.json."
    ),
]
VocabSize = Annotated[int, typer.Option(help="BPE vocabulary size.")]
TextKey = Annotated[
    str, typer.Option("--text-key", help="Field of .jsonl/.json/parquet records to read.")
]
EodToken = Annotated[
    str | None,
    typer.Option("--eod-token", help="End-of-document token of a tokenizer.json."),
]
Overwrite = Annotated[
    bool,
    typer.Option("--overwrite", help="Replace an earlier prepared dataset at --output."),
]
AllowBinary = Annotated[
    bool, typer.Option("--allow-binary", help="Tokenize inputs that do not look like text.")
]
ValidFraction = Annotated[
    float,
    typer.Option(
        "--valid-fraction",
        help="Share of whole documents held out for validation (evenly spread, by order).",
    ),
]
Format = Annotated[
    str,
    typer.Option(
        "--format",
        help="megatron: train/valid PREFIX.bin/.idx (Megatron-LM reads them too); "
        "shards: llmtrain's own shard files.",
    ),
]
InputFormat = Annotated[
    str | None,
    typer.Option(
        "--input-format",
        help="text, chat (messages / conversations records), instruct (prompt/completion) or "
        "preference (prompt/chosen/rejected); default: told from the records.",
    ),
]
ChatTemplate = Annotated[
    str | None,
    typer.Option(
        "--chat-template",
        help="A Jinja chat template file, or a built-in one: chatml, gemma, llama3, mistral, "
        "phi3 (default: the chat_template of the tokenizer_config.json beside --tokenizer).",
    ),
]
MaxRecordMib = Annotated[
    int,
    typer.Option(
        "--max-record-mib",
        help="Most MiB one JSON Lines record (and one document a BPE or tokenizer.json "
        "encodes) may hold; a chat template's rendering may make twice that.",
    ),
]
SeqLength = Annotated[
    int | None,
    typer.Option(
        "--seq-length",
        help="Chat data: report how it packs into rows of this model.seq_length.",
    ),
]


@data_app.command("prepare")
def data_prepare(
    inputs: Inputs,
    output: Output,
    tokenizer: Tokenizer = "byte",
    vocab_size: VocabSize = 4096,
    text_key: TextKey = "text",
    eod_token: EodToken = None,
    overwrite: Overwrite = False,
    allow_binary: AllowBinary = False,
    valid_fraction: ValidFraction = 0.01,
    fmt: Format = "megatron",
    input_format: InputFormat = None,
    chat_template: ChatTemplate = None,
    seq_length: SeqLength = None,
    max_record_mib: MaxRecordMib = 16,
    split: Split = "train",
    columns: Columns = None,
    as_json: JsonFlag = False,
) -> None:
    """Tokenize text into a train and a validation split with an index (then data.path=OUTPUT).

    Chat and instruct records (docs/finetuning.md) keep per-token loss roles; data.train_on,
    data.packing and data.overlong apply when a run reads them."""
    # A path that is there but is no regular file (a FIFO, a folder) is refused as what it is
    # when it is read (launcher.data.hf_tokenizer), never called missing.
    if tokenizer not in ("byte", "bpe") and not os.path.lexists(Path(tokenizer).expanduser()):
        raise UserError(
            f"--tokenizer={tokenizer}: must be byte, bpe, or the path of a tokenizer.json file"
        )
    if vocab_size < 256 + 1 and tokenizer == "bpe":
        raise UserError(f"--vocab-size={vocab_size}: a BPE vocabulary needs more than 256 entries")
    from launcher.data.dataset_records import RecordOptions, parse_columns
    from launcher.data.limits import DataLimits
    from launcher.data.prepare import prepare

    limits = DataLimits.from_mib(max_record_mib)
    index = prepare(
        [Path(p) for p in inputs],
        Path(output),
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        overwrite=overwrite,
        allow_binary=allow_binary,
        text_key=text_key,
        eod_token=eod_token,
        report=lambda line: err.print(Text(line, style="dim")),
        valid_fraction=valid_fraction,
        fmt=fmt,
        input_format=input_format,
        chat_template=chat_template,
        byte_eod=True,  # byte tokens: id 256 ends each document (vocabulary 257)
        limits=limits,
        records=RecordOptions(split, parse_columns(columns)),
    )
    document = index.to_json()
    if index.layout == "chat":
        from launcher.data.chat.chat_report import packing_reports

        document["packing"] = packing_reports(Path(output), seq_length)
    if as_json:
        print_json(document)
    else:
        show_prepared(document, output)


def show_prepared(document: dict[str, Any], output: str) -> None:
    """What `data prepare` wrote, and the key that trains on it."""
    if document["layout"] == "chat":
        chat = document["chat"]
        out.print(
            f"wrote {chat['train_examples']:,} training and {chat['valid_examples']:,} validation "
            f"{chat['input_format']} examples"
            + (
                f" ({chat['train_pairs']:,} + {chat['valid_pairs']:,} pairs)"
                if "train_pairs" in chat
                else ""
            )
            + f" ({document['total_tokens']:,} tokens, "
            f"{chat['assistant_tokens']:,} of them assistant tokens) to {output} (vocab "
            f"{document['vocab_size']}, template {chat['template']}); train on it with "
            f"data.path={output}",
            soft_wrap=True,  # one line whatever the path's length: grep finds its parts
        )
        for line in document["packing"]["lines"]:
            out.print(line)
        return
    files = (
        ", ".join(f"{p}.bin/.idx" for p in document["megatron_prefixes"].values())
        if document["layout"] == "megatron"
        else f"{len(document['shards'])} shard(s)"
    )
    out.print(
        f"wrote {document['total_tokens']:,} training and {document['valid_tokens']:,} "
        f"validation tokens ({files}) to {output} (vocab {document['vocab_size']}, "
        f"{document['tokenizer']}, end of document id {document['eod_id']}); train on it "
        f"with data.path={output}",
        soft_wrap=True,
    )
