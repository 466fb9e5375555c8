"""What ``shardtop run`` costs real clients: each alone and under ``shardtop run``, in turn, at two lengths.

Each client prints how long its own training loop took (the HF Trainer's ``train_runtime``; the others time
their loop), so start-up (imports, the launcher, the engine's set-up) is left out.  A run of n steps takes
``fixed + per_step * n``; from the two lengths, alone and probed, pair by pair:

    per-step ratio = (probed(long) - probed(short)) / (alone(long) - alone(short))
    fixed cost     = (probed(short) - alone(short)) - (per-step ratio - 1) * alone-per-step * short

Pairs alternate (alone, probed, alone, probed...) so that a machine that drifts hits both alike.  The
medians and the spread (min to max over pairs) are printed.

    python bench/bench_clients.py --device cuda [--pairs 5] [--short 20] [--long 200] [--clients hf,zero3,plain]
    python bench/bench_clients.py --device cpu --pairs 2 --short 5 --long 20      # a quick look without a GPU
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "own_scripts"
LOOP = re.compile(r"^loop seconds (\S+)$", re.MULTILINE)


def client_command(name: str, steps: int, cuda: bool) -> list[str]:
    gpu = ["--cuda"] if cuda else []
    if name == "hf":  # HF Trainer, FSDP2 through accelerate (DDP on CPU), a tiny Llama
        return ["torchrun", "--standalone", "--nproc_per_node", "1", str(SCRIPTS / "hf_trainer.py"),
                "--fsdp", "full_shard auto_wrap", "--steps", str(steps), *gpu]
    if name == "zero3":  # raw DeepSpeed ZeRO-3 under the deepspeed launcher
        return ["deepspeed", "--num_gpus", "1", str(SCRIPTS / "zero3_train.py"), "--steps", str(steps),
                "--width", "1024", *gpu]
    if name == "plain":  # a plain loop, no engine
        return [sys.executable, str(SCRIPTS / "large_vocab_loss.py"), "--vocab", "32000", "--seq", "512",
                "--dim", "512", "--steps", str(steps), *gpu]
    raise SystemExit(f"unknown client {name!r}: hf, zero3 or plain")


def loop_seconds(command: list[str], probed: bool, runs: Path, env: dict[str, str]) -> float:
    full = [sys.executable, "-m", "shardtop", "run", "--headless", "--runs-dir", str(runs), "--", *command] \
        if probed else command
    done = subprocess.run(full, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900, check=False)
    output = done.stdout + done.stderr
    if probed:  # the command's own output is in its log
        logs = sorted(runs.glob("*/logs/command-*.log"), key=lambda p: p.stat().st_mtime)
        output += logs[-1].read_text() if logs else ""
    found = LOOP.findall(output)
    if done.returncode != 0 or not found:
        raise SystemExit(f"{' '.join(full)} ended {done.returncode}:\n{output[-3000:]}")
    return float(found[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--short", type=int, default=20)
    parser.add_argument("--long", type=int, default=200)
    parser.add_argument("--clients", default="hf,zero3,plain")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds for each client: no pair starts that would end past it (0: no limit)")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRIPTS), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    # the launchers (torchrun, deepspeed) of the environment running this, as its activation would find them
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if not cuda:
        env.update(CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    print(f"device {args.device}, {args.pairs} pairs, {args.short} and {args.long} steps", flush=True)
    for name in args.clients.split(","):
        seconds: dict[tuple[bool, int], list[float]] = {}
        started, pairs = time.monotonic(), 0
        with tempfile.TemporaryDirectory() as tmp:
            for pair in range(args.pairs):
                spent = time.monotonic() - started
                if args.budget and pair and spent + spent / pair > args.budget:
                    print(f"{name}: {pair} pairs in {spent:.0f} s; another would pass --budget", flush=True)
                    break
                for steps in (args.short, args.long):
                    for probed in (False, True) if pair % 2 == 0 else (True, False):
                        runs = Path(tmp) / f"{name}-{pair}-{steps}-{probed}"
                        took = loop_seconds(client_command(name, steps, cuda), probed, runs, env)
                        seconds.setdefault((probed, steps), []).append(took)
                        print(f"  {name} pair {pair} {steps} steps {'probed' if probed else 'alone '}: "
                              f"loop {took:.3f} s", flush=True)
                pairs = pair + 1
        ratios, fixed = [], []
        for i in range(pairs):
            alone = (seconds[(False, args.long)][i] - seconds[(False, args.short)][i]) / (args.long - args.short)
            probed = (seconds[(True, args.long)][i] - seconds[(True, args.short)][i]) / (args.long - args.short)
            ratios.append(probed / alone)
            fixed.append(seconds[(True, args.short)][i] - seconds[(False, args.short)][i]
                         - (probed - alone) * args.short)
        print(f"{name}, {pairs} pairs: per-step ratio {statistics.median(ratios):.4f}"
              f" (spread {min(ratios):.4f}..{max(ratios):.4f});"
              f" fixed cost {statistics.median(fixed):+.3f} s (spread {min(fixed):+.3f}..{max(fixed):+.3f});"
              f" alone per step {statistics.median(seconds[(False, args.long)]) / args.long * 1000:.2f} ms",
              flush=True)


if __name__ == "__main__":
    main()
