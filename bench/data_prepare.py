"""Throughput of `llmtrain data prepare` with a tokenizer.json: all cores against one.

    python bench/data_prepare.py [--mb 200] [--runs 3] [--keep DIR]

Generates a JSON Lines corpus here (no download): documents of words drawn from Latin, Cyrillic,
Greek and CJK syllables and digits, Zipf-distributed like natural text; trains a byte-level BPE
(8,000 tokens, the `tokenizers` library) on its first megabytes; then runs `llmtrain data prepare
--tokenizer tokenizer.json --format megatron --valid-fraction 0.01` as a subprocess, once on every
core (the library's thread pool, TOKENIZERS_PARALLELISM=true, and prepare's reader thread) and once
as a single-core process (pinned to one CPU with sched_setaffinity, TOKENIZERS_PARALLELISM=false,
RAYON_NUM_THREADS=1), alternating, `--runs` times each.

Prints the median MB/s (input bytes) and tokens/s of both and the speed-up. Exits non-zero when
the two outputs are not byte-identical, or when the machine has two or more cores and the all-core
run is not faster than the one-core run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

_SCRIPTS = (
    "abcdefghijklmnopqrstuvwxyz",
    "абвгдежзиклмнопрстуфхцчшщыэюя",
    "αβγδεζηθικλμνξοπρστυφχψω",
    "的一是不了人我在有他这中大来上个国到说们为子和你地出道也时年",
)


def make_words(rng: np.random.Generator, count: int) -> list[str]:
    words = []
    for i in range(count):
        script = _SCRIPTS[i % len(_SCRIPTS)]
        length = int(rng.integers(1, 4 if script is _SCRIPTS[3] else 10))
        words.append("".join(script[int(j)] for j in rng.integers(0, len(script), size=length)))
    return words


def make_corpus(path: Path, megabytes: float, seed: int = 0) -> int:
    """Write about `megabytes` MB of documents to `path` (JSON Lines); returns its size in bytes."""
    rng = np.random.default_rng(seed)
    words = np.array(make_words(rng, 20_000), dtype=object)
    ranks = np.arange(1, words.size + 1)
    p = 1.0 / ranks
    p /= p.sum()
    target = int(megabytes * 1e6)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            lengths = rng.integers(50, 600, size=256)
            picks = rng.choice(words.size, size=int(lengths.sum()), p=p)
            start = 0
            lines = []
            for n in lengths:
                text = " ".join(words[picks[start : start + n]])
                if rng.random() < 0.3:
                    text += f" {int(rng.integers(0, 10**6))}."
                lines.append(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                start += n
            block = "".join(lines)
            f.write(block)
            written += len(block.encode("utf-8"))
    return path.stat().st_size


def train_tokenizer(corpus: Path, out: Path, sample_bytes: int = 8_000_000) -> None:
    from launcher.data.tokenizer import BPETokenizer

    texts = []
    seen = 0
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            seen += len(line)
            if seen > sample_bytes:
                break
    BPETokenizer.train(texts, 8000).save(out)


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def prepare_once(
    corpus: Path, tokenizer: Path, out: Path, parallel: bool
) -> tuple[float, dict[str, Any]]:
    env = dict(os.environ)
    env.pop("RAYON_NUM_THREADS", None)
    env["TOKENIZERS_PARALLELISM"] = "true" if parallel else "false"
    if not parallel:
        env["RAYON_NUM_THREADS"] = "1"
    first_cpu = min(os.sched_getaffinity(0))

    def pin() -> None:
        if not parallel:
            os.sched_setaffinity(0, {first_cpu})

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "data", "prepare", "--input", str(corpus),
         "--output", str(out), "--tokenizer", str(tokenizer), "--format", "megatron",
         "--valid-fraction", "0.01", "--overwrite", "--json"],
        capture_output=True, text=True, env=env, preexec_fn=pin,
    )  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"llmtrain data prepare failed:\n{done.stderr[-3000:]}")
    index = json.loads(done.stdout)
    # CPU seconds per wall second: how many cores the run kept busy (other load on the machine
    # lowers the wall-clock figures, not this one).
    index["busy_cores"] = (
        after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    ) / wall
    return wall, index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=200.0, help="corpus size in MB")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", help="generate the corpus into this folder and keep it")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        corpus = root / "corpus.jsonl"
        if not corpus.is_file() or corpus.stat().st_size < args.mb * 1e6 * 0.99:
            started = time.perf_counter()
            make_corpus(corpus, args.mb)
            print(f"generated {corpus.stat().st_size / 1e6:.0f} MB in "
                  f"{time.perf_counter() - started:.0f} s")  # fmt: skip
        tokenizer = root / "tokenizer.json"
        if not tokenizer.is_file():
            train_tokenizer(corpus, tokenizer)
        size = corpus.stat().st_size
        times: dict[bool, list[float]] = {True: [], False: []}
        busy: dict[bool, list[float]] = {True: [], False: []}
        digests: dict[bool, str] = {}
        tokens = 0
        for _ in range(args.runs):
            for parallel in (True, False):
                out = root / ("out-all" if parallel else "out-one")
                wall, index = prepare_once(corpus, tokenizer, out, parallel)
                times[parallel].append(wall)
                busy[parallel].append(index["busy_cores"])
                digests[parallel] = digest(out)
                tokens = index["total_tokens"] + index["valid_tokens"]
        rows = {}
        for parallel, label in ((True, f"all cores ({cores})"), (False, "one core")):
            median = statistics.median(times[parallel])
            rows[parallel] = median
            cores_busy = statistics.median(busy[parallel])
            print(f"{label:>18}: {median:7.2f} s  {size / 1e6 / median:7.2f} MB/s  "
                  f"{tokens / median:12,.0f} tokens/s  {cores_busy:.2f} cores busy  "
                  f"(median of {args.runs})")  # fmt: skip
        speedup = rows[False] / rows[True]
        print(f"corpus {size / 1e6:.0f} MB, {tokens:,} tokens; speed-up {speedup:.2f}x")
        failed = False
        if digests[True] != digests[False]:
            print("FAIL: the all-core and one-core outputs differ")
            failed = True
        else:
            print("outputs byte-identical: yes")
        if cores >= 2 and speedup <= 1.0:
            print(f"FAIL: {cores} cores and the all-core run is not faster ({speedup:.2f}x)")
            failed = True
        sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
