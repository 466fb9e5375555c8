"""What the probe costs a training step, and what a huge model's tree costs to write.

1. Step time with and without the probe, side by side in one process, on a
   model of >= 1000 modules: blocks of steps alternate (off, on, explained,
   off, on, explained...) so drift of the machine hits all alike; the ratios
   of medians are printed.  "On" is what a preset run has after its first
   steps: the rank's events (phase x3 + step per step), a census of memory by
   kind at phase changes (within its time budget), the memory sampler thread
   at 2 Hz, and OOM attribution armed.  "Explained" is what the first steps (or a
   request) cost: saved activations followed per module, a census at every
   phase and, on CUDA, the allocator's history recorded.  "Off" stops the
   sampler thread too.
2. A census of memory by kind: its cost on that model and the interval its
   budget allows.
3. Tree + shards of a 100 000-module model: read, encode and write time, and
   bytes on disk per rank; a census of it.

    python bench/bench_probe.py [--device cuda] [--blocks 8] [--steps 25] [--profile STEPS]
    python bench/bench_probe.py --explained RUN_DIR [RUN_DIR...]

The second form reads recorded runs (GPU ones) and prints, per rank, how much of
its peak allocated memory the recorded split explains, by kind, and at an OOM.

On a machine others load too, run it with ``OMP_NUM_THREADS=1`` and short
blocks (``--blocks 20 --steps 3``): OpenMP's spinning threads turn a neighbour's
load into steps 10-40 times slower, and long blocks let that drift decide the
ratio.  ``--clock thread`` (CPU only, with ``OMP_NUM_THREADS=1``) times the steps
by the training thread's CPU time instead of the wall clock: a step's work is all
on that thread then, and time the machine gives to others' processes is left out
(the probe's sampler thread is left out too).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

clock = time.perf_counter
"""What step times are read from (``--clock``)."""


def model_of(n_blocks: int, width: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(n_blocks):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.GELU(), nn.Dropout(0.0)]
    return nn.Sequential(*layers)


def step_times(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int, probe: bool,
               in_probe: list[float] | None = None) -> list[float]:
    """Each step's time (by ``clock``); ``in_probe`` gets, per step, the time spent inside the probe's own calls."""
    import shardtop.probe as st

    times = []
    for i in range(steps):
        if x.is_cuda:
            torch.cuda.synchronize()
        t0 = clock()
        spent = 0.0
        if probe:
            c = clock()
            st.phase("forward", i)
            spent += clock() - c
        loss = model(x).pow(2).mean()
        if probe:
            c = clock()
            st.phase("backward")
            spent += clock() - c
        loss.backward()
        if probe:
            c = clock()
            st.phase("optimizer")
            spent += clock() - c
        opt.step()
        opt.zero_grad(set_to_none=True)
        if x.is_cuda:
            torch.cuda.synchronize()
        elapsed = clock() - t0
        if probe:
            c = clock()
            st.step(i, loss=float(loss.detach()), seconds=elapsed)
            spent += clock() - c
            if in_probe is not None:
                in_probe.append(spent)
        times.append(elapsed)
    return times


class CollectionCount:
    """Collections of the cyclic garbage collector, by generation, while ``counting`` (a ``gc.callbacks`` entry)."""

    def __init__(self) -> None:
        self.counting = False
        self.by_generation = [0, 0, 0]

    def seen(self, stage: str, info: dict[str, Any]) -> None:
        if self.counting and stage == "start":
            self.by_generation[info["generation"]] += 1


def profile_on_steps(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int,
                     which: str = "steady") -> None:
    """Where the probe's ``which`` steps (steady, or explained) spend their time: cProfile of ``steps`` of
    them, the probe's functions by their cumulative time."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    step_times(model, opt, x, steps, probe=True)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(r"shardtop|cuda", 25)
    print(f"  cProfile of {steps} {which} steps with the probe (functions of shardtop and torch.cuda, cumulative):")
    print("\n".join("    " + line for line in out.getvalue().splitlines() if line.strip()))


def bench_overhead(device: str, blocks: int, steps: int, width: int, batch: int, profile: int = 0,
                   profile_explained: int = 0) -> None:
    import shardtop.probe as st
    from shardtop.probe.current import current
    from shardtop.probe.memory_explain import CENSUS_BUDGET, MemoryExplainer, MemoryOptions

    torch.manual_seed(0)
    model = model_of(300, width).to(device)
    n_modules = sum(1 for _ in model.modules())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=device)
    step_times(model, opt, x, 5, probe=False)  # warm-up
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        st.attach(model, optimizer=opt, run_dir=run_dir, name="bench", engine="plain")
        probe = current()
        assert probe is not None and probe.memory_probe.sampler is not None
        probe.phase_name = "x"
        steady = probe.memory()
        first = step_times(model, opt, x, 3, probe=True)  # the first steps, explained as every run's are
        explaining = MemoryExplainer(probe.device, MemoryOptions(explain_steps=10**9))
        explaining.set_target(model, opt)
        sampler = probe.memory_probe.sampler
        off: list[float] = []
        on: list[float] = []
        in_probe: list[float] = []
        explained: list[float] = []
        collections = CollectionCount()
        gc.callbacks.append(collections.seen)
        for _ in range(blocks):
            sampler.stop()
            off += step_times(model, opt, x, steps, probe=False)
            sampler.start()
            probe.memory_probe.explainer = steady
            on += step_times(model, opt, x, steps, probe=True, in_probe=in_probe)
            probe.memory_probe.explainer = explaining
            collections.counting = True
            explained += step_times(model, opt, x, steps, probe=True)
            collections.counting = False
        gc.callbacks.remove(collections.seen)
        if profile_explained:
            profile_on_steps(model, opt, x, profile_explained, "explained")
        probe.memory_probe.explainer = steady
        explaining.close()
        if profile:
            profile_on_steps(model, opt, x, profile)
        census = [steady.census.count() for _ in range(21)]
        faults = dict(probe.faults.told)
        probe.exit(0)
        probe.close()
        event_bytes = sum(p.stat().st_size for p in (run_dir / "events").iterdir())
    m_off, m_on, m_ex = statistics.median(off), statistics.median(on), statistics.median(explained)
    print(f"probe overhead on {device}: model of {n_modules} modules, batch {batch}x{width}, "
          f"{blocks} alternating blocks of {steps} steps")
    print(f"  median step without probe {m_off * 1e3:.3f} ms, with probe {m_on * 1e3:.3f} ms, "
          f"ratio {m_on / m_off:.4f} ({(m_on / m_off - 1) * 100:+.2f} %); event file {event_bytes / 1e6:.2f} MB")
    print(f"  inside the probe's calls on the training thread: median {statistics.median(in_probe) * 1e3:.3f} ms "
          f"a step, mean {statistics.fmean(in_probe) * 1e3:.3f} ms")
    print(f"  explained steps (the first {len(first) - 1} of a run, or on request): median {m_ex * 1e3:.3f} ms, "
          f"ratio {m_ex / m_off:.4f} ({(m_ex / m_off - 1) * 100:+.2f} %); "
          f"{explaining.activations.saved / max(1, len(explained)):.0f} saved tensors followed per step")
    print(f"  garbage collections during the explained steps by generation (0, 1, 2): "
          f"{', '.join(str(collections.by_generation[g]) for g in range(3))} in {len(explained)} steps")
    seconds = statistics.median(c.seconds for c in census if c is not None)
    print(f"  census of memory by kind: {seconds * 1e3:.2f} ms on this model, so at most every "
          f"{seconds / CENSUS_BUDGET:.2f} s, at a phase change; probe faults: {faults or 'none'}")
    if steady.trace_seconds is not None:
        taken, split = steady.trace_seconds
        print(f"  allocator trace of the first steps: snapshot {taken:.3f} s (training thread), "
              f"split {split:.3f} s (background)")
    if steady.peak_split is not None and x.is_cuda:
        print(f"  {describe_split(steady.peak_split, torch.cuda.max_memory_allocated())}")


MiB = 1 << 20


def bench_kept(device: str, blocks: int, width: int, batch: int) -> None:
    """What tracing one step for tensors kept across steps costs, beside an untraced step, alternating."""
    from shardtop.probe.kept import RETRACE_AFTER, KeptTracker, held_storages

    torch.manual_seed(0)
    model = model_of(300, width).to(device)
    names = {id(m): n for n, m in model.named_modules()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=device)
    step_times(model, opt, x, 3, probe=False)
    tracker = KeptTracker(names, lambda: 0, lambda: held_storages(model))
    plain: list[float] = []
    traced: list[float] = []
    for _ in range(blocks):
        plain += step_times(model, opt, x, 1, probe=False)
        tracker._start(0)  # the hook, as a traced step has it
        traced += step_times(model, opt, x, 1, probe=False)
        tracker.close()
        tracker._traced_step = None
    m_plain, m_traced = statistics.median(plain), statistics.median(traced)
    print(f"growth tracking: a traced step {m_traced * 1e3:.3f} ms against {m_plain * 1e3:.3f} ms untraced "
          f"(ratio {m_traced / m_plain:.4f}); one step in {RETRACE_AFTER} at most once memory climbs, so at most "
          f"{(m_traced / m_plain - 1) / RETRACE_AFTER * 100:+.2f} % over those steps; between traces one reading of "
          "memory per step")


def describe_split(split: Any, peak: int | None) -> str:
    """One line: how much of the peak a split explains, and by what."""
    allocated = split.allocated or 0
    explained = allocated - (split.unexplained or 0)
    kinds = ", ".join(f"{k} {v / MiB:.1f}" for k, v in msgspec.structs.asdict(split.by_kind).items() if v is not None)
    at = f"{split.phase} of step {split.step}" if split.phase else "a sample"
    true_peak = f" of the peak {peak / MiB:.1f} MiB" if peak else ""
    share = f"{100 * explained / allocated:.1f} %" if allocated else "-"
    return (f"split at {at} ({split.source}): {allocated / MiB:.1f} MiB{true_peak}, explained {share}; "
            f"MiB by kind: {kinds}; unexplained {(split.unexplained or 0) / MiB:.1f}")


def explained_report(run_dirs: list[Path]) -> None:
    """Per rank of each recorded run, as every view reads it (the read model): the allocator's peak,
    the split at it, and the split at an OOM."""
    from shardtop.read.whole_run import read_run
    from shardtop.rundir.run_directory import RunDirectory

    for run_dir in run_dirs:
        model = read_run(RunDirectory(run_dir))
        print(f"{run_dir}:")
        for r in model.ranks:
            split, peak = r.memory_peak, r.allocator_peak
            print(f"  rank {r.rank}: " + (describe_split(split, peak) if split else f"no split at the peak ({peak})"))
            if r.oom is not None and r.oom.memory is not None:
                print(f"  rank {r.rank} at the OOM in {r.oom.phase}: {describe_split(r.oom.memory, None)}")


def bench_big_tree(n_modules: int) -> None:
    from shardtop.probe.shards import read_shards
    from shardtop.rundir.event_files import EventWriter, event_file

    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(n_modules)))
    with tempfile.TemporaryDirectory() as tmp:
        writer = EventWriter(event_file(Path(tmp), 0), 0)
        t0 = time.perf_counter()
        tree, shards = read_shards(model, tree_id=0, stage="engine")
        t1 = time.perf_counter()
        writer.write(tree)
        writer.write(shards)
        t2 = time.perf_counter()
        size = event_file(Path(tmp), 0).stat().st_size
    print(f"tree + shards of a {n_modules + 1}-module model: read {t1 - t0:.3f} s, encode+write {t2 - t1:.3f} s, "
          f"total {t2 - t0:.3f} s, {size / 1e6:.2f} MB on disk for this rank")
    from shardtop.probe.memory_explain import CENSUS_BUDGET
    from shardtop.probe.memory_kinds import MemoryCensus

    census = MemoryCensus("cpu")
    census.set_target(model)
    t0 = time.perf_counter()
    census.count()  # lists the parameters once
    t1 = time.perf_counter()
    counts = [census.count() for _ in range(3)]
    seconds = min(c.seconds for c in counts if c is not None)
    print(f"census of memory by kind of that model ({2 * n_modules} parameters): first {t1 - t0:.3f} s "
          f"(listing them), then {seconds:.3f} s, so at most every {seconds / CENSUS_BUDGET:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--modules", type=int, default=100_000)
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="also profile STEPS steady steps with the probe (cProfile)")
    parser.add_argument("--profile-explained", type=int, default=0, metavar="STEPS",
                        help="also profile STEPS explained steps (cProfile)")
    parser.add_argument("--explained", type=Path, nargs="+", help="recorded run directories to read instead")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall",
                        help="time steps by the wall clock, or by the training thread's CPU time (CPU only)")
    args = parser.parse_args()
    if args.explained:
        explained_report(args.explained)
        return
    os.environ.pop("SHARDTOP_RUN_DIR", None)
    global clock
    if args.clock == "thread":
        if args.device != "cpu":
            parser.error("--clock thread times CPU steps only: a GPU's work is on no thread of this process")
        clock = time.thread_time
    timed_by = "the training thread's CPU time" if args.clock == "thread" else "the wall clock"
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus, device {args.device}, steps timed by {timed_by}")
    bench_overhead(args.device, args.blocks, args.steps, args.width, args.batch, args.profile,
                   args.profile_explained)
    bench_kept(args.device, args.blocks, args.width, args.batch)
    bench_big_tree(args.modules)


if __name__ == "__main__":
    main()
