"""The layout rules' arithmetic, written once: small predicates that the declared conditions of
validate's layout rules call (launcher/validate/parallel_rules.py and split_rules.py, which also
word the errors and the values that work). The layout search (launcher/search/space.py) reaches
them only through those conditions, and derives the micro-batches per step with ``microbatches``.

Conventions (launcher/validate/rules.py's docstring states them for users):
- tensor parallel splits the attention heads, the key/value heads (or replicates each kv head
  when the kv heads divide tp) and the MLP widths;
- context parallel is load-balanced: each rank holds two of 2 x cp sequence chunks;
- sequence parallel splits seq_length / cp over tp;
- expert groups are carved from the ranks the backend names (``backends.expert_span``);
- global batch = micro-batch x dp x micro-batches per step, and a pipeline needs at least pp
  micro-batches to fill;
- virtual stages (vpp > 1) go with pp > 1 and the interleaved schedule, and every pipeline chunk
  needs a layer.
"""

from __future__ import annotations

from collections.abc import Sequence


def tp_divides_heads(heads: int, tp: int) -> bool:
    return heads % tp == 0


def tp_fits_kv_heads(kv_heads: int, tp: int) -> bool:
    """tp divides the key/value heads, or they divide tp (each kv head then replicated)."""
    return kv_heads % tp == 0 or tp % kv_heads == 0


def tp_splits(size: int, tp: int) -> bool:
    """A width split column- or row-wise over tp (ffn_hidden_size, moe_ffn_hidden_size)."""
    return size % tp == 0


def cp_splits_sequence(seq_length: int, cp: int) -> bool:
    return cp == 1 or seq_length % (2 * cp) == 0


def sp_splits_sequence(seq_length: int, cp: int, tp: int) -> bool:
    return (seq_length // cp) % tp == 0


def ep_divides_experts(experts: int, ep: int) -> bool:
    return experts % ep == 0


def ep_fits_span(span: int, ep: int) -> bool:
    """ep divides the ranks its groups are carved from (the backend's expert span)."""
    return span % ep == 0


def microbatches(
    global_batch: int, micro_batch: int, dp: int, grad_accum: int | None
) -> int | None:
    """Micro-batches per step for a given global batch, or None when the batch arithmetic fails
    (global != micro x dp x grad_accum, or not a multiple of micro x dp when grad_accum is
    derived)."""
    per_pass = micro_batch * dp
    if grad_accum is not None:
        return grad_accum if per_pass * grad_accum == global_batch else None
    if global_batch % per_pass:
        return None
    return max(1, global_batch // per_pass)


def pipeline_fills(microbatches: int, pp: int) -> bool:
    return pp <= 1 or microbatches >= pp


def virtual_stages_scheduled(pp: int, schedule: str, vpp: int) -> bool:
    """vpp > 1 needs pp > 1 and the interleaved schedule; interleaved needs vpp >= 2."""
    if vpp > 1 and (pp == 1 or schedule != "interleaved"):
        return False
    return not (schedule == "interleaved" and vpp == 1)


def split_counts_fit(counts: Sequence[int], chunks: int, layers: int) -> bool:
    """An explicit parallel.pp_layers: one entry per chunk, each >= 1, summing to the layers."""
    return len(counts) == chunks and sum(counts) == layers and min(counts, default=0) >= 1


def chunks_have_layers(layers: int, chunks: int) -> bool:
    return layers >= chunks
