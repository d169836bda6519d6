"""kill -9 a random rank at a random step after the first checkpoint, resume, and compare the
final weights with an uninterrupted run: 20 trials; exits 1 on any mismatch.

    python bench/kill_resume.py [--trials 20] [--seed 0] [backend=torch ...]

One uninterrupted reference run, then for each trial: start the same run in a fresh folder, SIGKILL
a random rank once a random number of steps past the first checkpoint is logged (tests/faults.py
finds the process through /proc), check `llmtrain run` exits non-zero, run the same command
again, and compare the final weights digest (summary.json weights_sha256, a sha256 over every
rank's parameter bytes; tests/unit/train/engines/test_weights_digest.py shows it tells weights one
ulp apart) with the reference. A trial passes when the launcher tore the run down, the next run
resumed from a checkpoint and finished, and the weights match bit for bit. Exit status 0 only when
every trial passes.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faults import (
    TRIAL_ARGS,
    TRIAL_FIRST_CHECKPOINT,
    TRIAL_STEPS,
    llmtrain_run,
    run_and_kill,
    weights_digest,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*")
    opts = parser.parse_args()
    args = [*TRIAL_ARGS, *opts.overrides]
    rng = random.Random(opts.seed)
    torn = finished = resumed = matched = passed = 0
    with tempfile.TemporaryDirectory() as tmp:
        reference = Path(tmp) / "reference"
        reference.mkdir()
        done = llmtrain_run(reference, args)
        if done.returncode != 0:
            sys.exit(done.stderr[-3000:])
        expected = weights_digest(reference)
        if expected is None:
            sys.exit("the reference run wrote no summary.json")
        for trial in range(opts.trials):
            cwd = Path(tmp) / f"trial{trial}"
            cwd.mkdir()
            step = rng.randint(TRIAL_FIRST_CHECKPOINT + 1, TRIAL_STEPS - 1)
            rank = rng.randint(0, 1)
            started = time.perf_counter()
            code = run_and_kill(cwd, args, cwd / "runs" / "trial", step, rank)
            torn += code != 0
            again = llmtrain_run(cwd, args)
            found = re.search(r"resumed from \S+ \(step (\d+)\)", again.stdout)
            finished += again.returncode == 0
            resumed += found is not None
            how = f"resumed at step {found.group(1)}" if found else "restarted (no checkpoint yet)"
            same = weights_digest(cwd) == expected
            matched += same
            ok = code != 0 and again.returncode == 0 and found is not None and same
            passed += ok
            print(
                f"trial {trial + 1:2}: kill -9 rank {rank} after step {step}: exit {code}; "
                f"{how}, exit {again.returncode}; weights "
                f"{'match' if same else 'DIFFER'} ({time.perf_counter() - started:.0f} s)"
                f"{'' if ok else '  FAIL'}",
                flush=True,
            )
    print(
        f"{opts.trials} trials: {torn} torn down by the launcher, {finished} finished on the "
        f"next run, {resumed} resumed from a checkpoint, {matched} matched the uninterrupted run "
        f"bit for bit; {passed}/{opts.trials} passed"
    )
    if passed != opts.trials:
        sys.exit(1)


if __name__ == "__main__":
    main()
