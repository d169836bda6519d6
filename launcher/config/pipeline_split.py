"""Uneven pipeline splits: the transformer layers of every pipeline stage and virtual stage, from
the keys Megatron-Core reads, with exactly the conditions Megatron-Core checks.

Pure functions, no imports from the rest of llmtrain (config/layout.py, validate/, search/,
backends/ and render/ all call them). Chunk order everywhere: index c = v * pp + s is virtual
stage v of pipeline stage s (Megatron-Core's layout order; ``Layout.chunk_layers``).

The keys (parallel.*) and the Megatron-Core sources they follow (NVIDIA/Megatron-LM, read at
commit d98e8a6):
- ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage``
  (``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``):
  megatron/core/transformer/transformer_config.py, ``__post_init__`` ("Uneven PP"): each > 0 and,
  with virtual stages, divisible by vpp; the remaining layers divide evenly over the middle
  stages, and per middle stage by vpp; middle layers exist exactly when middle stages do.
  megatron/core/transformer/transformer_block.py, ``get_num_layers_to_build``: each virtual stage
  of the first (last) stage holds first/vpp (last/vpp) layers, of a middle stage middle/vpp.
- ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``: same
  files; the embedding (loss) counts as one layer: num_layers + e + l divides by pp and, with
  virtual stages, per stage by vpp; the first virtual stage of the first stage (the last virtual
  stage of the last stage) builds one transformer layer fewer (it may be left with none).
  Not together with the first/last counts (transformer_config.py raises).
- ``pipeline_layout`` (``--pipeline-model-parallel-layout``):
  megatron/core/transformer/pipeline_parallel_layer_layout.py: commas are cosmetic, ``(...)*n``
  then ``x*n`` unroll, ``|`` separates virtual stages; E embedding, L loss, t decoder layer, m
  multi-token prediction; the number of stages is a multiple of pp (vpp = stages / pp); E first
  and exactly once, L last and exactly once, as many t as num_layers, no m unless the model has
  MTP layers (llmtrain's models have none); a stage may be empty. It excludes every other split
  key (transformer_config.py) and sets the virtual stages itself (megatron/training/arguments.py:
  not with --num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank).
- None of them: num_layers divides by pp (arguments.py) and per stage by vpp
  (transformer_block.py).
Where E and L sit in a layout string only matters for the check: Megatron-Core builds the
embedding on the first virtual stage of the first stage and the loss on the last virtual stage of
the last stage (pre_process / post_process), whatever the string says.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache

FIRST = "parallel.num_layers_in_first_pipeline_stage"
LAST = "parallel.num_layers_in_last_pipeline_stage"
EMBEDDING = "parallel.account_for_embedding_in_pipeline_split"
LOSS = "parallel.account_for_loss_in_pipeline_split"
LAYOUT = "parallel.pipeline_layout"
SPLIT_KEYS = (FIRST, LAST, EMBEDDING, LOSS, LAYOUT)


@dataclass(frozen=True)
class SplitKeys:
    """The values of the split keys (None / False: not set)."""

    first: int | None = None
    last: int | None = None
    embedding: bool = False
    loss: bool = False
    layout: str | None = None
    # model.mtp_layers: the "m" a layout must place (not a split key itself).
    mtp: int = 0

    @property
    def any(self) -> bool:
        return bool(
            self.first is not None
            or self.last is not None
            or self.embedding
            or self.loss
            or self.layout is not None
        )

    def overrides(self) -> tuple[str, ...]:
        """The override words that set these keys."""
        out: list[str] = []
        if self.layout is not None:
            out.append(f'{LAYOUT}="{self.layout}"')
        if self.first is not None:
            out.append(f"{FIRST}={self.first}")
        if self.last is not None:
            out.append(f"{LAST}={self.last}")
        if self.embedding:
            out.append(f"{EMBEDDING}=true")
        if self.loss:
            out.append(f"{LOSS}=true")
        return tuple(out)

    def describe(self) -> str:
        return " ".join(self.overrides())


class SplitError(ValueError):
    """A split Megatron-Core refuses: the keys, and a message naming values that work."""

    def __init__(self, keys: tuple[str, ...], message: str):
        self.keys = keys
        self.message = message
        super().__init__(message)


# --- the layout string ----------------------------------------------------------------------------

_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")  # (...)*n, one level, as Megatron-Core unrolls it
_REPEAT = re.compile(r"(.)\*(\d+)")  # x*n
_LAYER_CHARS = frozenset("ELtm")


def layout_stages(text: str) -> tuple[str, ...]:
    """The virtual stages of a layout string, unrolled, in layout order ("Et|tt|tL" ->
    ("Et", "tt", "tL")). Raises SplitError on a character Megatron-Core does not know."""
    flat = text.replace(",", "")
    flat = _GROUP.sub(lambda g: g.group(1) * int(g.group(2)), flat)
    flat = _REPEAT.sub(lambda g: g.group(1) * int(g.group(2)), flat)
    stages = tuple(flat.split("|"))
    bad = sorted({c for c in flat if c not in _LAYER_CHARS and c != "|"})
    if bad:
        raise SplitError(
            (LAYOUT,),
            f'{LAYOUT}="{text}": unknown character(s) {", ".join(repr(c) for c in bad)}; a layout '
            "has E (embedding), t (transformer layer), m (multi-token prediction), L (loss), "
            "| between virtual stages, "
            '(...)*n and x*n repeats and cosmetic commas, e.g. "Et|(tt|)*30L"',
        )
    return stages


def _layout_chunks(
    text: str, num_layers: int, pp: int, vpp: int, explain: bool, mtp: int = 0
) -> tuple[int, ...]:
    stages = layout_stages(text)
    balanced = balanced_layout(num_layers, pp, vpp)
    if mtp:  # the MTP modules right before the loss
        balanced = balanced[:-1] + "m" * mtp + "L"
    hint = f'e.g. {LAYOUT}="{balanced}"' if explain else ""
    if len(stages) % pp:
        raise SplitError(
            (LAYOUT, "parallel.pp"),
            f'{LAYOUT}="{text}" has {len(stages)} virtual stages, not a multiple of '
            f"parallel.pp={pp}; it needs pp x vpp = {pp * vpp} stages, {hint}",
        )
    if len(stages) != pp * vpp:
        got = len(stages) // pp
        raise SplitError(
            (LAYOUT, "parallel.vpp"),
            f'{LAYOUT}="{text}" has {len(stages)} = {pp} x {got} virtual stages, so it needs '
            f"parallel.vpp={got}"
            + (" and parallel.pp_schedule=interleaved" if got > 1 else "")
            + f" (parallel.vpp={vpp}); or {hint}",
        )
    flat = "".join(stages)
    problems = []
    if not flat.startswith("E") or flat.count("E") != 1:
        problems.append("E exactly once, as the first layer")
    if not flat.endswith("L") or flat.count("L") != 1:
        problems.append("L exactly once, as the last layer")
    if flat.count("t") != num_layers:
        problems.append(f"as many t as model.num_layers={num_layers} (it has {flat.count('t')})")
    # Megatron-Core's PipelineParallelLayerLayout.validate_layer_layout: as many m as
    # mtp_num_layers, and no decoder layer after the first m.
    if flat.count("m") != mtp:
        problems.append(
            f"as many m as model.mtp_layers={mtp} (it has {flat.count('m')})"
            if mtp
            else f"no m without multi-token prediction (set model.mtp_layers={flat.count('m')}, "
            "or drop the m)"
        )
    elif mtp and "t" in flat[flat.index("m") :]:
        problems.append("every t before the first m (the MTP modules follow the last layer)")
    if problems:
        raise SplitError(
            (LAYOUT, "model.num_layers"),
            f'{LAYOUT}="{text}": Megatron-Core needs ' + "; ".join(problems) + f"; {hint}",
        )
    return tuple(s.count("t") for s in stages)


def balanced_layout(num_layers: int, pp: int, vpp: int) -> str:
    """A layout string with E and L counted as one layer each and the num_layers + 2 spread as
    evenly as the stages allow (extra layers to the middle stages), repeats folded:
    61 layers at pp 8 x vpp 4 -> "Et|(tt|)*30L"."""
    chunks = max(1, pp * vpp)
    base, extra = divmod(num_layers + 2, chunks)
    counts = [base] * chunks
    middle = sorted(range(1, chunks - 1), key=lambda i: (abs(i - (chunks - 1) / 2), i))
    order = [0, chunks - 1, *middle] if base == 0 else [*middle, 0, chunks - 1]
    for i in order[:extra]:
        counts[i] += 1
    words = []
    for i, n in enumerate(counts):
        layers = n - (i == 0) - (i == chunks - 1)
        word = "t" * layers if layers < 3 else f"t*{layers}"
        words.append(("E" if i == 0 else "") + word + ("L" if i == chunks - 1 else ""))
    out: list[str] = []
    i = 0
    while i < len(words):
        j = i
        while j + 1 < len(words) and words[j + 1] == words[i]:
            j += 1
        run = j - i + 1
        last = j == len(words) - 1
        if run >= 2 and not last:
            out.append(f"({words[i]}|)*{run}")
        elif run >= 2:
            out.append(f"({words[i]}|)*{run - 1}{words[i]}")
        else:
            out.append(words[i] + ("" if last else "|"))
        i = j + 1
    return "".join(out)


# --- the split ------------------------------------------------------------------------------------


@cache  # pure; the search derives the same few splits for many layouts
def megatron_split(
    num_layers: int, pp: int, vpp: int, keys: SplitKeys, explain: bool = True
) -> tuple[int, ...]:
    """Transformer layers of each of the pp x vpp virtual stages (index v * pp + s), as
    Megatron-Core builds them for these keys; SplitError with what works when it refuses them
    (explain=False: without the splits that work, which cost a search)."""
    pp, vpp = max(1, pp), max(1, vpp)

    def hint() -> str:
        return suggestion(num_layers, pp, vpp) if explain else "see the splits that work"

    counts = (keys.first is not None) or (keys.last is not None)
    if keys.layout is not None and (counts or keys.embedding or keys.loss):
        raise SplitError(
            (LAYOUT, FIRST, LAST, EMBEDDING, LOSS),
            f"{LAYOUT} places every layer itself; Megatron-Core refuses it together with the "
            "first/last stage layer counts or the account_for_* flags: set only one of them",
        )
    if counts and (keys.embedding or keys.loss):
        raise SplitError(
            (FIRST, LAST, EMBEDDING, LOSS),
            "the first/last pipeline stage layer counts and account_for_embedding/loss_in_"
            "pipeline_split cannot be set together in Megatron-Core: use one or the other",
        )
    if keys.layout is not None:
        return _layout_chunks(keys.layout, num_layers, pp, vpp, explain, keys.mtp)
    if keys.any and pp == 1:
        raise SplitError(
            (FIRST, LAST, EMBEDDING, LOSS, "parallel.pp"),
            "the pipeline split keys need parallel.pp >= 2 (with pp=1 every layer is on one stage)",
        )
    if counts:
        return _first_last(num_layers, pp, vpp, keys, hint)
    extra = int(keys.embedding) + int(keys.loss)
    total = num_layers + extra
    per_stage, rem = divmod(total, pp)
    if rem or per_stage % vpp or per_stage == 0:
        keyset = (EMBEDDING, LOSS) if extra else ("model.num_layers",)
        what = (
            f"model.num_layers={num_layers} + {extra} (embedding/loss counted) = {total}"
            if extra
            else f"model.num_layers={num_layers}"
        )
        raise SplitError(
            (*keyset, "parallel.pp", "parallel.vpp"),
            f"{what} does not split evenly over pp={pp}"
            + (f" x vpp={vpp}" if vpp > 1 else "")
            + " (Megatron-Core needs layers divisible by pp, and per stage by vpp); "
            + hint(),
        )
    per_chunk = per_stage // vpp
    out = [per_chunk] * (pp * vpp)
    out[0] -= int(keys.embedding)
    out[-1] -= int(keys.loss)
    return tuple(out)


def _first_last(
    num_layers: int, pp: int, vpp: int, keys: SplitKeys, hint: Callable[[], str]
) -> tuple[int, ...]:
    rest, middle = num_layers, pp
    for key, value in ((FIRST, keys.first), (LAST, keys.last)):
        if value is None:
            continue
        if value <= 0 or value % vpp:
            need = f"a multiple of parallel.vpp={vpp}" if vpp > 1 else "at least 1"
            raise SplitError(
                (key, "parallel.vpp"),
                f"{key}={value}: Megatron-Core needs {need}; " + hint(),
            )
        rest -= value
        middle -= 1
    if rest < 0 or bool(rest) != bool(middle) or (middle and rest % (middle * vpp)):
        raise SplitError(
            (FIRST, LAST, "model.num_layers"),
            f"{rest} layers left for {middle} middle stage(s)"
            + (f" x vpp={vpp}" if vpp > 1 else "")
            + ": Megatron-Core needs them to split evenly (and none left without middle stages); "
            + hint(),
        )
    per_middle = rest // middle if middle else 0
    stage = [per_middle] * pp
    if keys.first is not None:
        stage[0] = keys.first
    if keys.last is not None:
        stage[-1] = keys.last
    return tuple(stage[c % pp] // vpp for c in range(pp * vpp))


def even_split_ok(num_layers: int, pp: int, vpp: int) -> bool:
    return num_layers % (max(1, pp) * max(1, vpp)) == 0


@cache
def accepted_splits(num_layers: int, pp: int, vpp: int) -> tuple[SplitKeys, ...]:
    """The ways Megatron-Core takes this layer count at pp x vpp, best first: the even split, the
    embedding and/or loss counted as layers, first/last stage counts (the most even), and a layout
    string, which always works. Empty for pp = 1 or fewer layers than virtual stages."""
    pp, vpp = max(1, pp), max(1, vpp)
    if pp == 1 or num_layers < pp * vpp:
        return ()
    out: list[SplitKeys] = []
    if even_split_ok(num_layers, pp, vpp):
        out.append(SplitKeys())
    for keys in (
        SplitKeys(embedding=True, loss=True),
        SplitKeys(embedding=True),
        SplitKeys(loss=True),
    ):
        if _works(num_layers, pp, vpp, keys):
            out.append(keys)
    best: tuple[tuple[int, int], SplitKeys] | None = None
    for keys in _first_last_candidates(num_layers, pp, vpp):
        if not _works(num_layers, pp, vpp, keys):
            continue
        stages = megatron_split(num_layers, pp, vpp, keys, explain=False)
        per_stage = [sum(stages[s::pp]) for s in range(pp)]
        score = (max(per_stage), max(per_stage) - min(per_stage))
        if best is None or score < best[0]:
            best = (score, keys)
    if best is not None:
        out.append(best[1])
    out.append(SplitKeys(layout=balanced_layout(num_layers, pp, vpp)))
    return tuple(out)


def _first_last_candidates(num_layers: int, pp: int, vpp: int) -> list[SplitKeys]:
    """First/last stage counts worth trying: for every middle-stage count q (a multiple of vpp),
    the first or last stage alone taking the rest, or both sharing it as evenly as multiples of
    vpp allow (the most even split for that q; any split Megatron-Core takes has one such q)."""
    out: list[SplitKeys] = []

    def halves(total: int) -> list[tuple[int, int]]:
        if total < 2 * vpp or total % vpp:
            return []
        low = (total // 2) // vpp * vpp
        pairs = {(f, total - f) for f in (low, low + vpp) if vpp <= f <= total - vpp}
        return sorted(pairs)

    if pp == 2:
        out += [SplitKeys(first=f, last=lst) for f, lst in halves(num_layers)]
    for q in range(vpp, num_layers + 1, vpp):
        rest = num_layers - (pp - 1) * q
        if rest > 0 and rest % vpp == 0:
            out += [SplitKeys(first=rest), SplitKeys(last=rest)]
        if pp > 2:
            both = num_layers - (pp - 2) * q
            out += [SplitKeys(first=f, last=lst) for f, lst in halves(both)]
        if (pp - 2) * q > num_layers:
            break
    return out


def _works(num_layers: int, pp: int, vpp: int, keys: SplitKeys) -> bool:
    try:
        megatron_split(num_layers, pp, vpp, keys, explain=False)
    except SplitError:
        return False
    return True


def suggestion(num_layers: int, pp: int, vpp: int) -> str:
    """'use ...': the split keys that work for this layer count at pp x vpp (two at most)."""
    options = [k for k in accepted_splits(num_layers, pp, vpp) if k.any][:2]
    if not options:
        return f"use a pp x vpp of at most {num_layers} virtual stages"
    return "splits that work: " + "; or ".join(k.describe() for k in options)


# --- the schedule on an uneven split --------------------------------------------------------------


@cache  # pure; asked for the same stages by many layouts
def interleaved_warmup(pp: int, vpp: int, stage: int) -> int:
    """Chunk forwards Megatron-Core's interleaved 1F1B runs on `stage` before its first backward
    (megatron/core/pipeline_parallel/schedules.py, get_pp_rank_microbatches): (pp - stage - 1) x 2
    + (vpp - 1) x pp, before capping at the chunk forwards there are."""
    return (pp - stage - 1) * 2 + (max(1, vpp) - 1) * pp


@lru_cache(maxsize=4096)  # pure; every plan asks it of every stage, the search of many layouts
def layers_in_flight(
    schedule: str,
    pp: int,
    microbatches: int,
    vpp: int,
    stage: int,
    stage_chunks: tuple[int, ...],
    extra_warmup: int = 0,
) -> int:
    """Peak transformer layer-forwards whose activations are alive on `stage` (stage_chunks: the
    layers of each of its virtual stages, in order), for a stage of equal chunks the chunk
    micro-batches in flight (schedule.chunk_microbatches_in_flight) times the chunk's layers.

    Interleaved 1F1B as Megatron-Core runs it (megatron/core/pipeline_parallel/schedules.py,
    get_pp_rank_microbatches and get_schedule_table, microbatch_group_size_per_vp_stage = pp):
    (pp - stage - 1) * 2 + (vpp - 1) * pp warm-up chunk forwards, then one forward and one
    backward at a time; forward k runs virtual stage (k // pp) % vpp, backward k the reverse.
    With unequal virtual stages the peak is found by walking the steady state for one period.
    extra_warmup: forwards run ahead of that warm-up (schedule.chunk_microbatches_in_flight)."""
    m = max(1, microbatches)
    if pp <= 1 or not stage_chunks:
        return max(stage_chunks, default=0)
    if schedule == "gpipe":
        return m * sum(stage_chunks)
    if schedule != "interleaved" or vpp <= 1:
        return min(m, pp - stage + extra_warmup) * sum(stage_chunks)
    total = m * vpp
    warm = min(total, interleaved_warmup(pp, vpp, stage) + extra_warmup)

    def fwd(k: int) -> int:
        return stage_chunks[(k // pp) % vpp]

    def bwd(k: int) -> int:
        return stage_chunks[vpp - 1 - (k // pp) % vpp]

    alive = sum(fwd(k) for k in range(warm))
    peak = alive
    for k in range(min(total - warm, 2 * pp * vpp)):
        alive += fwd(warm + k)
        peak = max(peak, alive)
        alive -= bwd(k)
    return peak


def bubble_scale(stage_layers: tuple[int, ...]) -> float:
    """The bubble of an uneven split relative to an even one with the heaviest stage's layers.

    In a pipeline whose stages take t_s per micro-batch the fill and drain cost sum(t) - max(t)
    (every stage but the slowest runs once outside the steady state); an even split of p stages
    costs (p - 1) max(t) (Narayanan et al. 2021, section 2.2). With times proportional to the
    transformer layers: (sum - max) / ((p - 1) max); 1 for an even split."""
    pp = len(stage_layers)
    heaviest = max(stage_layers, default=0)
    if pp <= 1 or heaviest <= 0:
        return 1.0
    return (sum(stage_layers) - heaviest) / ((pp - 1) * heaviest)


def mtp_stage(layout_text: str | None, pp: int, mtp: int) -> int | None:
    """The pipeline stage holding the multi-token-prediction modules: the one whose virtual stage
    has the layout's first m, else the last stage (Megatron-Core builds them there). None without
    MTP."""
    if mtp <= 0:
        return None
    pp = max(1, pp)
    if layout_text is None:
        return pp - 1
    for index, stage in enumerate(layout_stages(layout_text)):
        if "m" in stage:
            return index % pp
    return pp - 1
