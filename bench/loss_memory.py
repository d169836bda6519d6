"""The loss over a 128k vocabulary: full fp32 logits against the chunked loss, time and peak memory.

    python bench/loss_memory.py [--tokens 2048] [--hidden 512] [--vocab 128256] [--chunk N]
        [--dtype bf16|fp32] [--layers 1] [--device cpu|cuda] [--repeats 3]

Builds llmtrain's model (``launcher.train.model.transformer``: one Llama block, hidden --hidden,
vocabulary
--vocab, untied head) and times forward + backward of the loss on --tokens tokens (a batch of 1
sequence), both ways:
- full: ``loss_fn(model(tokens), targets)``, the logits [N, V] in the compute dtype, an fp32 copy
  and the fp32 softmax gradient;
- chunked: ``model(tokens, targets)`` with ``chunked_loss`` on
(``launcher.train.model.chunked_loss``). Each way runs in its own fresh process so that peak memory
is its own: on CUDA ``torch.cuda.max_memory_allocated``; on CPU the process's peak resident set
(``ru_maxrss``) minus its resident set after building the model and the inputs (the weights' and the
libraries' share). Prints the median step time over --repeats (after one warm-up), the peak, and the
loss of each.

Exit status: 1 when the chunked path's peak memory exceeds the full path's, or the two losses
differ by more than 1e-3 relative; 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MIB = 2**20


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def measure(args: argparse.Namespace, chunked: bool) -> dict[str, float]:
    import torch

    from launcher.config.schema import ModelConfig
    from launcher.train.model.transformer import build_model, loss_fn

    torch.manual_seed(0)
    device = torch.device(args.device)
    cfg = ModelConfig(
        num_layers=args.layers,
        hidden_size=args.hidden,
        ffn_hidden_size=args.hidden * 4,
        num_attention_heads=max(1, args.hidden // 64),
        vocab_size=args.vocab,
        seq_length=args.tokens,
        activation="swiglu",
        norm="rmsnorm",
        position="rope",
        tie_embeddings=False,
    )
    model = build_model(cfg, device=device, seed=0)
    model.chunked_loss = chunked
    model.loss_chunk_tokens = args.chunk
    rows = torch.randint(0, args.vocab, (1, args.tokens + 1), device=device)
    inputs, targets = rows[:, :-1], rows[:, 1:]
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]

    def step() -> float:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(inputs, targets) if chunked else loss_fn(model(inputs), targets)
        loss.backward()
        model.zero_grad(set_to_none=False)  # keep the gradient buffers: not part of the loss
        return float(loss)

    if device.type == "cuda":
        torch.cuda.synchronize()
    base = _rss_bytes()
    loss = step()  # warm-up; allocates the gradients
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        loss = step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if device.type == "cuda":
        peak = float(torch.cuda.max_memory_allocated())
    else:
        peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base)
    return {"time_s": statistics.median(times), "peak_bytes": peak, "loss": loss}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=None, help="tokens per chunk (None: default)")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=["full", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args, args.one == "chunked")))
        return 0
    results = {}
    for way in ("full", "chunked"):
        argv = [a for a in sys.argv[1:]]
        done = subprocess.run(
            [sys.executable, __file__, *argv, "--one", way], capture_output=True, text=True
        )
        if done.returncode != 0:
            print(f"{way}: failed\n{done.stdout}{done.stderr}")
            return 1
        results[way] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"loss over V={args.vocab}, {args.tokens} tokens, hidden {args.hidden}, {args.dtype} on "
        f"{args.device} (chunk: {args.chunk or 'default'} tokens)"
    )
    print(f"{'path':8} {'fwd+bwd s':>10} {'peak MiB':>10} {'loss':>10}")
    for way, r in results.items():
        print(f"{way:8} {r['time_s']:10.3f} {r['peak_bytes'] / MIB:10.1f} {r['loss']:10.4f}")
    full, chunked = results["full"], results["chunked"]
    print(
        f"chunked / full: time {chunked['time_s'] / full['time_s']:.2f}x, "
        f"peak {chunked['peak_bytes'] / full['peak_bytes']:.2f}x"
    )
    problems = []
    if chunked["peak_bytes"] > full["peak_bytes"]:
        problems.append("the chunked loss used more peak memory than the full logits")
    if abs(chunked["loss"] - full["loss"]) > 1e-3 * abs(full["loss"]):
        problems.append(f"losses differ: {chunked['loss']} vs {full['loss']}")
    for p in problems:
        print(f"FAIL: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
