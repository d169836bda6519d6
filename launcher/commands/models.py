"""`export` and `sample`: a run's trained model, written out as a Hugging Face folder or asked
for a short greedy reply."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher.commands.common import JsonFlag, complete_run, note, out, print_json
from launcher.errors import UserError

Step = Annotated[
    int | None, typer.Option("--step", help="Checkpoint step (default: newest valid).")
]
Root = Annotated[
    str, typer.Option("--root", help="The folder holding run directories (run.root_dir).")
]


def export(
    run_dir: Annotated[
        str,
        typer.Argument(
            help="The run: its name as `llmtrain runs` lists it (or a unique prefix) or folder.",
            autocompletion=complete_run,
        ),
    ],
    out_dir: Annotated[str, typer.Option("--out", "-o", help="Folder to write the model into.")],
    fmt: Annotated[str, typer.Option("--format", help="Output format: hf (Hugging Face).")] = "hf",
    step: Step = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a non-empty --out folder.")
    ] = False,
    root: Root = "runs",
    adapter: Annotated[
        bool, typer.Option("--adapter", help="A LoRA run's adapters alone, as a PEFT folder.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Export a run's checkpoint as a Hugging Face model folder (safetensors, config, tokenizer);
    a LoRA run's adapters merged into its base, or alone with --adapter."""
    if fmt != "hf":
        raise UserError(f"--format={fmt}: the only export format is hf (Hugging Face)")
    from launcher.launch.local_runs import CHECKPOINTED, resolve_run
    from launcher.train.checkpoint.hf_export import export_hf

    # A run's name under --root, as `status`/`logs`/`cancel` take it; a name that several runs
    # begin with: the newest that holds a checkpoint (a note names the others).
    resolved = resolve_run(run_dir, Path(root), CHECKPOINTED)
    if resolved.note:
        note(resolved.note)
    folder = resolved.folder or Path(run_dir)
    result = export_hf(folder, Path(out_dir), step=step, overwrite=overwrite, adapter=adapter)
    note(result.gathered, label="weights: ")
    if as_json:
        print_json(result.to_json())
    else:
        out.print(
            f"exported step {result.step} of {run_dir} as {result.architecture} "
            f"({result.parameters:,} parameters) to {result.out}; tokenizer: {result.tokenizer}"
        )


def sample(
    run_dir: Annotated[str, typer.Argument(help="The run: its name (or prefix) or folder.")],
    prompt: Annotated[
        str | None, typer.Argument(help="The text to continue (or --messages / --user).")
    ] = None,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", help="Tokens to generate (1-512).")
    ] = 32,
    step: Step = None,
    root: Root = "runs",
    raw: Annotated[
        bool,
        typer.Option(
            "--raw", help="Continue PROMPT as plain text, without the data's chat template."
        ),
    ] = False,
    temperature: Annotated[
        float, typer.Option(help="0: greedy (the default); above 0: sample, e.g. 0.7.")
    ] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Sample among the k likeliest.")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, (0, 1].")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the sampling (same seed, same text).")] = 0,
    dtype: Annotated[str, typer.Option(help="fp32 (default) or bf16.")] = "fp32",
    messages: Annotated[
        str | None,
        typer.Option("--messages", help="A JSON file: a list of role/content messages."),
    ] = None,
    user: Annotated[
        list[str] | None, typer.Option("--user", help="A user turn (repeatable).")
    ] = None,
    assistant: Annotated[
        list[str] | None,
        typer.Option("--assistant", help="An assistant turn between --user turns (repeatable)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Print a short reply to PROMPT from a run's model (LoRA adapters applied): greedy, or
    sampled with --temperature/--top-k/--top-p/--seed; one user message (or a conversation:
    --messages FILE, --user/--assistant) in the run data's chat template when it has one, else a
    continuation of the text."""
    from launcher.launch.local_runs import CHECKPOINTED, resolve_run
    from launcher.train.decoding import Decoding, read_messages, turns
    from launcher.train.sample import sample as run_sample

    given = [name for name, v in (("PROMPT", prompt), ("--messages", messages),
                                  ("--user", user)) if v]  # fmt: skip
    if len(given) != 1:
        raise UserError(
            "give the prompt one way: PROMPT, --messages FILE.json or --user TEXT"
            + (f" (got {', '.join(given)})" if given else "")
        )
    if assistant and not user:
        raise UserError("--assistant: only between --user turns")
    conversation = read_messages(messages) if messages else None
    if user:
        conversation = turns(user, assistant or [])
    decoding = Decoding(temperature, top_k, top_p, seed, dtype)
    # As export takes it: a name that several runs begin with (or a run and its --fresh runs),
    # the newest that holds a checkpoint, with a note naming the others.
    resolved = resolve_run(run_dir, Path(root), CHECKPOINTED)
    if resolved.note:
        note(resolved.note)
    folder = resolved.folder or Path(run_dir)
    result = run_sample(
        folder, prompt or "", max_new_tokens=max_new_tokens, step=step, chat=not raw,
        messages=conversation, decoding=decoding,
    )  # fmt: skip
    note(result.loaded, label="weights: ")
    if as_json:
        print_json(result.to_json())
    elif result.template is not None:  # a chat reply: the reply alone, below the prompt
        out.print(f"user: {result.prompt}\nassistant: {result.text}", markup=False, highlight=False)
    else:
        out.print(result.prompt + result.text, markup=False, highlight=False)
