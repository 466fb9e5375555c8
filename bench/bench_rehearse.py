"""A rehearsal's wall time beside the plan's, for the same preset and job size, side by side in one run.

`shardtop plan PRESET devices=N` builds the model on the meta device and traces a forward pass;
`shardtop rehearse PRESET devices=N rank=R --headless` builds rank R's shards for real and trains
``max_steps`` steps.  Each pair alternates (plan, rehearse, plan, rehearse, ...) so drift of the
machine hits both alike; the medians and their ratio are printed per case.

    python bench/bench_rehearse.py [--repeat 3] [--case "fsdp2-mlp devices=8 max_steps=2" ...]

On a GPU machine the presets run at their GPU sizes (story 2's 18 000 layers); on CPU at their CPU
sizes.  Run it alone: two jobs on one GPU (or two cores) measure each other.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CPU_CASES = (
    "zero3-linear devices=6 max_steps=2",
    "zero3-linear-fixed devices=6 rank=last max_steps=2",
    "fsdp-auto-wrap devices=2 max_steps=2",
    "fsdp2-mlp devices=8 rank=last max_steps=2",
)


def timed(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "shardtop", *args], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1):  # a rehearsal that runs out of memory exits 1, as the job would
        raise SystemExit(f"shardtop {' '.join(args)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--case", action="append", help="a preset and its settings, as typed after rehearse")
    args = parser.parse_args()
    cases = args.case or list(CPU_CASES)
    runs = tempfile.mkdtemp(prefix="bench-rehearse-")
    env = {**os.environ, "SHARDTOP_RUNS_DIR": runs, "PYTHONUNBUFFERED": "1"}
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, runs in {runs}")
    print(f"{'case':<52} {'plan s':>8} {'rehearse s':>11} {'ratio':>7}")
    for case in cases:
        words = case.split()
        plan_words = [w for w in words if not w.startswith(("rank=", "max_steps="))]
        plans: list[float] = []
        rehearsals: list[float] = []
        for _ in range(args.repeat):
            plans.append(timed(["plan", *plan_words], env))
            rehearsals.append(timed(["rehearse", "--headless", *words], env))
        plan, rehearse = statistics.median(plans), statistics.median(rehearsals)
        print(f"{case:<52} {plan:>8.2f} {rehearse:>11.2f} {rehearse / plan:>6.1f}x", flush=True)


if __name__ == "__main__":
    main()
