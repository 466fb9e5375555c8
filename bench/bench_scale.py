"""What a run over many hosts costs the TUI: 64 hosts × 8 ranks side by side with 1 host × 8 ranks.

Both runs are the same model, a 24-layer transformer (245 modules, 5.1 G
parameters, 9.5 GiB in bf16) sharded with FSDP2 over every rank, written as the probe
writes it: each rank's hello, tree and shards, a memory sample every 0.5 s
(each host's local rank 0 adds NVML of its host's 8 GPUs), and forward /
backward / optimizer phases and a step every 2 s.  The run directory is laid
out as ``shardtop run`` over several hosts leaves it on shared storage (one
supervisor record per host, touched every 5 s); the machine that watches it
is none of the hosts, as a login node is.  The run starts with 20 s of history.

Then, while a writer process goes on appending at that cadence (2 Hz per rank):

1. Open: ``shardtop attach RUN`` in a 160×48 pseudo-terminal, from process start
   to a screen holding the tree and the ranks (median of 3).  And inside the app
   (Textual's headless driver): from the app's start to the first paint of the
   tree with the model in it and of the memory panel with the ranks.
2. CPU: ``shardtop attach RUN`` in the pseudo-terminal at a 1 s refresh, CPU time
   over ``--seconds`` (20 s), after 3 s to settle; and bytes written per second.

    python bench/bench_scale.py [--seconds 20] [--hosts 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.terminal import Terminal  # noqa: E402
from shardtop.rundir.event_files import event_file  # noqa: E402
from shardtop.rundir.event_lines import encode  # noqa: E402
from shardtop.rundir.events import Event, Hello, Memory, Phase, Shards, Step, Tree, Unit  # noqa: E402
from shardtop.rundir.memory_figures import GpuMemory  # noqa: E402

E = TypeVar("E", bound=Event)

RANKS_PER_HOST = 8
LAYERS = 24
HIDDEN = 4096
VOCAB = 32_000
BF16 = 2
GIB = 1024**3
H200 = 150_754_820_096
STEP_S = 2.0
SAMPLE_S = 0.5
HISTORY_S = 20.0
HEARTBEAT_S = 5.0
PID_BASE = 4_200_000
"""Above Linux's largest pid (2**22): no process on the watching machine has these."""
SHARDTOP = [sys.executable, "-m", "shardtop"]


# -- the run ------------------------------------------------------------------------------


def transformer_tree() -> Tree:
    """A GPT-like model: embedding, 24 blocks (two LayerNorms, attention qkv/proj, MLP fc/act/proj), head."""
    names, parents, types, params = ["", "embed"], [-1, 0], [0, 1], [0, VOCAB * HIDDEN]
    type_names = ["GPT", "Embedding", "ModuleList", "Block", "LayerNorm", "Attention", "Linear", "MLP", "GELU"]
    names.append("blocks")
    parents.append(0)
    types.append(2)
    params.append(0)
    blocks = len(names) - 1
    h = HIDDEN
    for i in range(LAYERS):
        block = len(names)
        rows = [
            (str(i), blocks, 3, 0),
            ("ln1", block, 4, 2 * h),
            ("attn", block, 5, 0),
            ("qkv", block + 2, 6, 3 * h * h + 3 * h),
            ("proj", block + 2, 6, h * h + h),
            ("ln2", block, 4, 2 * h),
            ("mlp", block, 7, 0),
            ("fc", block + 6, 6, 4 * h * h + 4 * h),
            ("act", block + 6, 8, 0),
            ("proj", block + 6, 6, 4 * h * h + h),
        ]
        for name, parent, kind, count in rows:
            names.append(name)
            parents.append(parent)
            types.append(kind)
            params.append(count)
    for name, kind, count in (("ln_f", 4, 2 * h), ("head", 6, h * VOCAB)):
        names.append(name)
        parents.append(0)
        types.append(kind)
        params.append(count)
    return Tree(
        tree_id=0,
        names=names,
        parents=parents,
        types=types,
        type_names=type_names,
        params=params,
        bytes=[p * BF16 for p in params],
    )


def block_roots(tree: Tree) -> list[int]:
    return [row for row, t in enumerate(tree.types) if tree.type_names[t] == "Block"]


def shards_of(tree: Tree, world: int) -> Shards:
    """FSDP2 over every rank: each block a unit, the root the rest; every parameter split ``world`` ways."""
    roots = block_roots(tree)
    unit_of = [0] * len(tree.names)
    for u, root in enumerate(roots, start=1):
        end = roots[u] if u < len(roots) else len(tree.names) - 2
        for row in range(root, end):
            unit_of[row] = u
    numel = [0] * (len(roots) + 1)
    for row, p in enumerate(tree.params):
        numel[unit_of[row]] += p
    units = [
        Unit(module=root, kind="fsdp2", numel=numel[u], local_numel=-(-numel[u] // world), strategy="FULL_SHARD",
             dtype="bfloat16", params=2)
        for u, root in enumerate([0, *roots])
    ]
    held = [-(-b // world) for b in tree.bytes]
    return Shards(
        tree_id=0,
        engine="fsdp2",
        stage="engine",
        devices=["cuda"],
        states=["sharded"],
        bytes=held,
        device=[0 if b else -1 for b in held],
        state=[0 if b else -1 for b in held],
        unit=unit_of,
        units=units,
        info={"driver": "fully_shard"},
    )


@dataclass(frozen=True)
class Layout:
    hosts: int

    @property
    def world(self) -> int:
        return self.hosts * RANKS_PER_HOST

    def host(self, rank: int) -> str:
        return f"gpu-{rank // RANKS_PER_HOST + 1:03d}"

    def pid(self, rank: int) -> int:
        return PID_BASE + rank


def allocated(rank: int, t: float, held: int) -> int:
    """Model shard + optimizer state + activations that rise and fall with the step."""
    phase = (t % STEP_S) / STEP_S
    return held * 4 + int((18 + 40 * phase * (1 - phase) + (rank % 7) * 0.3) * GIB)


def host_gpus(layout: Layout, host_index: int, t: float, held: int) -> list[GpuMemory]:
    first = host_index * RANKS_PER_HOST
    return [
        GpuMemory(
            index=i,
            name="NVIDIA H200",
            uuid=f"GPU-{host_index:03d}-{i}",
            used=allocated(first + i, t, held) + 2 * GIB,
            total=H200,
            util=90 + (first + i) % 10,
            temperature=50 + i,
            power_w=600.0 - 5 * i,
            pids=[layout.pid(first + i)],
        )
        for i in range(RANKS_PER_HOST)
    ]


def memory(layout: Layout, rank: int, t: float, held: int) -> Memory:
    a = allocated(rank, t, held)
    gpus = host_gpus(layout, rank // RANKS_PER_HOST, t, held) if rank % RANKS_PER_HOST == 0 else None
    return Memory(device=f"cuda:{rank % RANKS_PER_HOST}", allocated=a, reserved=a + GIB, peak=a + 2 * GIB,
                  host_rss=9 * GIB, gpus=gpus)


def stamp(event: E, layout: Layout, rank: int, t: float) -> E:
    """``event`` as rank ``rank`` wrote it at ``t`` (a copy: events are frozen)."""
    return msgspec.structs.replace(event, rank=rank, host=layout.host(rank), t=t)


def make_run(root: Path, hosts: int) -> Path:
    """The run directory with ``HISTORY_S`` seconds of events, ending now."""
    layout = Layout(hosts)
    run = root / f"20261201-090000-train-{hosts}h"
    (run / "events").mkdir(parents=True, mode=0o700)
    (run / "logs").mkdir(mode=0o700)
    (run / "supervisors").mkdir(mode=0o700)
    now = time.time()
    start = now - HISTORY_S
    meta = {"id": run.name, "preset": "", "created": start, "host": layout.host(0), "user": "trainer",
            "config": {"program": "train", "world_size": layout.world}, "own_job": True,
            "command": ["torchrun", "--nnodes", str(hosts), "--nproc_per_node", "8", "train.py"],
            "pid": PID_BASE - 1, "pgid": PID_BASE - 1, "pid_started": start}
    (run / "run.json").write_text(json.dumps(meta, indent=2))
    for h in range(hosts):
        record = {"host": layout.host(h * RANKS_PER_HOST), "pid": PID_BASE - 2 - h, "started": start,
                  "command": meta["command"], "cwd": "/home/trainer", "joined": start}
        (run / "supervisors" / f"{record['host']}-{record['pid']}.json").write_text(json.dumps(record))
    tree = transformer_tree()
    shards = shards_of(tree, layout.world)
    held = sum(shards.bytes)
    for rank in range(layout.world):
        lines = [
            stamp(Hello(pid=layout.pid(rank), world_size=layout.world, local_rank=rank % RANKS_PER_HOST,
                        node_rank=rank // RANKS_PER_HOST, device=f"cuda:{rank % RANKS_PER_HOST}", engine="fsdp2",
                        strategy="fully_shard", program="train",
                        versions={"python": "3.12.3", "torch": "2.11.0"}), layout, rank, start),
            stamp(tree, layout, rank, start + 1),
            stamp(shards, layout, rank, start + 2),
        ]
        t, step = start + 2.5, 0
        while t < now:
            if (t - start) % STEP_S < SAMPLE_S:
                step += 1
                lines += [stamp(Phase(phase=p, step=step), layout, rank, t + i * 0.1)
                          for i, p in enumerate(("forward", "backward", "optimizer"))]
                lines.append(stamp(Step(step=step, loss=2.0 / step, seconds=STEP_S), layout, rank, t + 0.4))
            lines.append(stamp(memory(layout, rank, t, held), layout, rank, t + 0.05))
            t += SAMPLE_S
        event_file(run / "events", rank).write_bytes(b"".join(encode(e) for e in lines))
    os.chmod(run, 0o700)
    return run


def write_on(run: Path, hosts: int) -> None:
    """Go on as the run would: every rank a memory sample each 0.5 s, a step each 2 s; heartbeats each 5 s."""
    layout = Layout(hosts)
    tree = transformer_tree()
    held = sum(shards_of(tree, layout.world).bytes)
    files = [open(event_file(run / "events", r), "ab", buffering=0) for r in range(layout.world)]  # noqa: SIM115
    records = sorted((run / "supervisors").glob("*.json"))
    step = int(HISTORY_S / STEP_S)
    tick, beat = time.time(), 0.0
    while True:
        t = time.time()
        if t - beat >= HEARTBEAT_S:
            for record in records:
                os.utime(record)
            beat = t
        new_step = int(t / STEP_S) != int((t - SAMPLE_S) / STEP_S)
        if new_step:
            step += 1
        for rank, f in enumerate(files):
            out = []
            if new_step:
                out += [encode(stamp(Phase(phase=p, step=step), layout, rank, t))
                        for p in ("forward", "backward", "optimizer")]
                out.append(encode(stamp(Step(step=step, loss=2.0 / step, seconds=STEP_S), layout, rank, t)))
            out.append(encode(stamp(memory(layout, rank, t, held), layout, rank, t)))
            f.write(b"".join(out))
        tick += SAMPLE_S
        time.sleep(max(0.0, tick - time.time()))


# -- measuring ----------------------------------------------------------------------------


class Writer:
    """``write_on`` in its own process, for as long as the ``with`` block."""

    def __init__(self, run: Path, hosts: int) -> None:
        self.args = [sys.executable, str(Path(__file__).resolve()), "--write", str(run), "--hosts", str(hosts)]

    def __enter__(self) -> Writer:
        self.proc = subprocess.Popen(self.args, cwd=ROOT)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def attach(root: Path, run: Path, refresh: float = 1.0) -> Terminal:
    return Terminal([*SHARDTOP, "attach", str(run), "--runs-dir", str(root)],
                    env={"SHARDTOP_REFRESH": str(refresh), "PYTHONPATH": str(ROOT)})


ON_SCREEN = (b"Shard tree", b"blocks", b"/140G")
"""The run view with the tree (a block list) and the memory panel (allocated of the GPUs' 140 GiB) drawn."""


def open_in_terminal(root: Path, run: Path, trials: int = 3) -> float:
    times = []
    for _ in range(trials):
        term = attach(root, run)
        try:
            times.append(term.wait_for(*ON_SCREEN, timeout=60))
        finally:
            term.close()
    return statistics.median(times)


async def open_in_app(root: Path, run: Path) -> tuple[float, float, float]:
    """Seconds from the app's start to the tree's first paint with the model, and to the memory panel's with
    ranks; and the CPU seconds the app used until both (a figure a busy machine inflates less than wall time)."""
    from shardtop.tui.app import ShardtopApp
    from shardtop.tui.widgets.rank_memory import RankMemory
    from shardtop.tui.widgets.shard_tree import ShardTree

    painted: dict[str, float] = {}
    tree_lines = ShardTree.render_lines
    memory_render = RankMemory.render

    def timed_lines(self: ShardTree, crop: Any) -> Any:
        strips = tree_lines(self, crop)
        if self.model is not None:
            painted.setdefault("tree", time.perf_counter())
        return strips

    def timed_render(self: RankMemory) -> Any:
        text = memory_render(self)
        if self.rows:
            painted.setdefault("ranks", time.perf_counter())
        return text

    ShardTree.render_lines = timed_lines  # type: ignore[method-assign]
    RankMemory.render = timed_render  # type: ignore[method-assign]
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        app = ShardtopApp(root, run=str(run), refresh=1.0)
        async with app.run_test(size=(160, 48)) as pilot:
            while len(painted) < 2 and time.perf_counter() - t0 < 30:
                await pilot.pause(0.01)
            cpu = time.process_time() - c0
    finally:
        ShardTree.render_lines = tree_lines  # type: ignore[method-assign]
        RankMemory.render = memory_render  # type: ignore[method-assign]
    return painted["tree"] - t0, painted["ranks"] - t0, cpu


def cpu_while_written(root: Path, run: Path, seconds: float) -> tuple[float, float]:
    term = attach(root, run)
    try:
        term.wait_for(*ON_SCREEN, timeout=60)
        time.sleep(3.0)
        return term.measure(seconds)
    finally:
        term.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="CPU measuring window")
    parser.add_argument("--hosts", type=int, default=64, help="hosts of the large run (8 ranks each)")
    parser.add_argument("--write", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:
        write_on(args.write, args.hosts)
        return
    load = os.getloadavg()
    print(f"shardtop scale benchmark - {os.cpu_count()} cores, python {sys.version.split()[0]}, "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for hosts in (1, args.hosts):
            t0 = time.perf_counter()
            run = make_run(root, hosts)
            size = sum(p.stat().st_size for p in (run / "events").iterdir())
            made = time.perf_counter() - t0
            print(f"{hosts:>3} host(s) x {RANKS_PER_HOST} ranks: {hosts * RANKS_PER_HOST} event files, "
                  f"{size / 2**20:.1f} MiB of events ({HISTORY_S:.0f} s of history), made in {made:.1f} s")
            with Writer(run, hosts):
                time.sleep(1.0)
                pty_open = open_in_terminal(root, run)
                tree_s, ranks_s, open_cpu = asyncio.run(open_in_app(root, run))
                cpu, rate = cpu_while_written(root, run, args.seconds)
            results[hosts] = (pty_open, tree_s, ranks_s, open_cpu, cpu, rate)
    print()
    print(f"{'':44}{'1 host x 8':>14}{f'{args.hosts} hosts x 8':>16}   goal")
    rows = [
        ("open, process start to screen (pty, median of 3)", 0, "{:.3f} s", "<= 1 s"),
        ("open, in app: tree painted", 1, "{:.3f} s", "<= 1 s"),
        ("open, in app: memory panel painted", 2, "{:.3f} s", ""),
        ("open, in app: CPU seconds until both", 3, "{:.3f} s", ""),
        (f"CPU at 1 s refresh, {args.seconds:.0f} s, while written", 4, "{:.2f} %", "<= 5 % of a core"),
        ("bytes to the terminal per second", 5, "{:.0f} B/s", ""),
    ]
    for label, i, fmt, goal in rows:
        small, large = fmt.format(results[1][i]), fmt.format(results[args.hosts][i])
        print(f"{label:<44}{small:>14}{large:>16}   {goal}")
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"other processes' CPU right now: {psutil.cpu_percent(1.0):.0f} % of {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
