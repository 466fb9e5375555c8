"""What some of shardtop's parts cost, each beside a reference measured in the same run.

1. The memory sampler's pace: the gaps between its samples at 2 Hz while the
   training thread is idle, and while it computes in Python (holding the
   interpreter), as ratios of the interval; and how long ``stop()`` takes with
   a sample due only in 30 s.
2. The shard tree of a model with N sibling modules (``ShardModel.build``
   and the lines shown): 100 000 beside 10 000, per module.
3. Reading a 101 001-module model's tree and shards (``read_shards``) beside
   walking its modules (``named_modules``), and the bytes they encode to.
4. The report of a 100 000-module run, text, Markdown and JSON, beside reading
   the run (``read_run``) that each of them starts with.
5. The launch prompt: planning every strategy for two GPUs on a key, beside
   describing the model on the meta device once (what the helper process does).
6. The bootstrap in a process that is no rank: ``python -c pass`` with it and
   without it (``SHARDTOP_DISABLE=1``), alternating; and its import time as
   Python's ``-X importtime`` counts it.
7. DeepSpeed's duplicate-parameter check on 2500 layers, its own and the
   rehearsal's one-pass version.

    python bench/bench_costs.py [--repeat 5]

Each figure is a median of ``--repeat`` alternating runs; ratios are taken
between figures measured side by side in this one process.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def median_seconds(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def sampler_pace(seconds: float) -> None:
    from shardtop.probe.memory import MemorySampler

    def gaps(busy: bool) -> list[float]:
        taken: list[float] = []
        sampler = MemorySampler(lambda sample: taken.append(time.monotonic()), device="cpu", interval=0.5,
                                sample_gpus=False, limit=None)
        sampler.start()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if busy:
                sum(i * i for i in range(10_000))
            else:
                time.sleep(0.05)
        sampler.stop()
        return [b - a for a, b in zip(taken, taken[1:], strict=False)]

    for busy in (False, True):
        found = gaps(busy)
        print(f"sampler at 0.5 s, training thread {'busy in Python' if busy else 'idle'}: {len(found)} gaps, "
              f"median {statistics.median(found):.3f} s ({statistics.median(found) / 0.5:.2f}x the interval), "
              f"max {max(found):.3f} s ({max(found) / 0.5:.2f}x)")
    stops = []
    for _ in range(5):
        written: list[object] = []
        sampler = MemorySampler(written.append, device="cpu", interval=30.0, sample_gpus=False, limit=None)
        sampler.start()
        while not written:
            time.sleep(0.01)
        started = time.perf_counter()
        sampler.stop()
        stops.append(time.perf_counter() - started)
    print(f"sampler stop with the next sample 30 s away: median {statistics.median(stops) * 1000:.2f} ms, "
          f"max {max(stops) * 1000:.2f} ms (of 5)")


def shard_tree(repeat: int) -> None:
    from shardtop.read.shard_model import ShardModel
    from shardtop.read.tree_lines import default_expanded, visible_lines
    from shardtop.rundir.events import Shards, Tree, Unit

    def build(n: int) -> Callable[[], object]:
        tree = Tree(tree_id=0, names=["", *map(str, range(n - 1))], parents=[-1, *([0] * (n - 1))],
                    types=[0, *([1] * (n - 1))], type_names=["Sequential", "Linear"],
                    params=[0, *([10] * (n - 1))], bytes=[0, *([40] * (n - 1))])

        def shards(rank: int) -> Shards:
            return Shards(tree_id=0, engine="zero3", stage="engine", devices=[f"cuda:{rank}"], states=["sharded"],
                          bytes=list(tree.bytes), device=[0 if p else -1 for p in tree.params],
                          state=[0 if p else -1 for p in tree.params], unit=[-1] * n,
                          units=[Unit(module=1, kind="zero3", numel=100, local_numel=50)], rank=rank)

        ranks = {0: shards(0), 1: shards(1)}

        def work() -> object:
            model = ShardModel.build(tree, ranks)
            return visible_lines(model, default_expanded(model))

        return work

    small, large = median_seconds(build(10_000), repeat), median_seconds(build(100_000), repeat)
    print(f"shard tree, build and lines shown: 10 000 modules {small:.3f} s, 100 000 modules {large:.3f} s; "
          f"per module {large / 100_000 * 1e6:.2f} µs against {small / 10_000 * 1e6:.2f} µs "
          f"({large / 100_000 / (small / 10_000):.2f}x)")


def read_tree(repeat: int) -> None:
    import torch
    from torch import nn

    from shardtop.probe.shards import read_shards
    from shardtop.rundir.event_lines import encode

    class Cell(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.empty(2, 2))
            self.bias = nn.Parameter(torch.empty(2))

    model = nn.Sequential(*(nn.Sequential(*(Cell() for _ in range(100))) for _ in range(1000)))
    walk = median_seconds(lambda: list(model.named_modules()), repeat)
    read = median_seconds(lambda: read_shards(model, tree_id=0, stage="setup"), repeat)
    tree, shards = read_shards(model, tree_id=0, stage="setup")
    size = len(encode(tree)) + len(encode(shards))
    print(f"101 001 modules: read_shards {read:.3f} s, named_modules alone {walk:.3f} s ({read / walk:.1f}x); "
          f"tree + shards encode to {size / 1e6:.2f} MB")


def report(repeat: int) -> None:
    from shardtop.read.whole_run import read_run
    from shardtop.report import render_report
    from shardtop.rundir.run_directory import RunDirectory
    from tests.support.built_runs import big_tree_run

    with tempfile.TemporaryDirectory() as tmp:
        run = RunDirectory(big_tree_run(Path(tmp)))
        read = median_seconds(lambda: read_run(run), repeat)
        figures = {fmt: median_seconds(lambda fmt=fmt: render_report(run, fmt), repeat)  # type: ignore[misc]
                   for fmt in ("text", "markdown", "json")}
    said = ", ".join(f"{fmt} {s:.2f} s ({s / read:.1f}x)" for fmt, s in figures.items())
    print(f"report of a 100 000-module run: reading the run {read:.2f} s; {said}; "
          f"all three {sum(figures.values()):.2f} s")


def launch_key(repeat: int) -> None:
    from shardtop.config import resolve
    from shardtop.launch import resolve_devices
    from shardtop.trace.presets import _describe, describe_preset
    from shardtop.tui.widgets.plan_bars import plan_text, prompt_plan
    from tests.support.launch_prompt import two_h200s

    config = resolve_devices(resolve("zero3-linear", [("gpu_mem_limit", "15GiB")]), lambda: 2)

    def describe() -> object:
        _describe.cache_clear()
        return describe_preset(config)

    described = median_seconds(describe, max(1, repeat // 2))
    desc = describe_preset(config)
    gpus = two_h200s()
    key = median_seconds(lambda: plan_text(prompt_plan(config, desc, gpus)), 10 * repeat)
    print(f"launch prompt, zero3-linear (18 000 layers) on two H200s: a key's plan {key * 1000:.1f} ms, "
          f"the description on the meta device {described:.2f} s ({described / key:.0f}x a key)")


def bootstrap(repeat: int) -> None:
    from shardtop.inject import command_env
    from tests.support.own_job_runs import user_env

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "run").mkdir()
        (Path(tmp) / "off").mkdir()
        runs = {"with": command_env(user_env(), Path(tmp) / "run"),
                "without": command_env(user_env(SHARDTOP_DISABLE="1"), Path(tmp) / "off")}
        walls: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(2 * repeat + 1):  # the first round writes the bytecode, as an installed package has it
            for name, env in runs.items():
                started = time.perf_counter()
                subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
                walls[name].append(time.perf_counter() - started)
        imports = []
        for _ in range(2 * repeat):
            done = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=runs["with"],
                                  capture_output=True, text=True, check=True)
            row = next(line for line in done.stderr.splitlines() if re.search(r"\|\s+sitecustomize$", line))
            imports.append(int(row.split("|")[1]))
    on, off = (statistics.median(walls[k][1:]) for k in ("with", "without"))
    print(f"bootstrap in a process that is no rank: python -c pass {on * 1000:.1f} ms with it, {off * 1000:.1f} ms "
          f"without ({on / off:.2f}x, {(on - off) * 1000:+.1f} ms); sitecustomize's import "
          f"{statistics.median(imports) / 1000:.2f} ms (median of {len(imports)}, -X importtime)")


def duplicate_check(repeat: int) -> None:
    import importlib

    import torch

    from shardtop.inject.rehearsal import patch_deepspeed_engine

    original = importlib.import_module("deepspeed.runtime.engine").DeepSpeedEngine._check_for_duplicates
    engine_class = type("DeepSpeedEngine", (), {"_check_for_duplicates": original})
    patch_deepspeed_engine(type("deepspeed.runtime.engine", (), {"DeepSpeedEngine": engine_class}))  # type: ignore[arg-type]
    patched = engine_class.__dict__["_check_for_duplicates"]
    model = torch.nn.Sequential(*(torch.nn.Linear(2, 2) for _ in range(2500)))
    params = list(model.parameters())
    optimizer = type("Optimizer", (), {"param_groups": [{"params": params[:2500]}, {"params": params[2500:]}]})()
    engine = type("Engine", (), {"module": model})()
    one_pass = median_seconds(lambda: patched(engine, optimizer), repeat)
    theirs = median_seconds(lambda: original(engine, optimizer), max(1, repeat // 2))
    print(f"duplicate-parameter check, 2500 layers (5000 parameters): DeepSpeed's {theirs:.2f} s, "
          f"the rehearsal's {one_pass * 1000:.2f} ms ({theirs / one_pass:.0f}x)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sampler-seconds", type=float, default=10.0)
    args = parser.parse_args()
    os.environ.pop("SHARDTOP_RUN_DIR", None)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    print(f"{platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}, "
          f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    sampler_pace(args.sampler_seconds)
    shard_tree(args.repeat)
    read_tree(args.repeat)
    report(args.repeat)
    launch_key(args.repeat)
    bootstrap(args.repeat)
    duplicate_check(args.repeat)
    print(f"load average at the end {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
