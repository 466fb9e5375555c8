"""What shardtop sends down an SSH link, side by side with nvitop: bytes per second and the first frame.

    python bench/bench_ssh.py [--seconds 15] [--size 120x40] [--nvml auto|real|recorded]
                              [--only home attach nvitop] [--attach-run RUN_DIR] [--dump DIR]

Each program runs in a pseudo-terminal of the given size, one after the other in
this one run, at a 1 s and a 0.25 s refresh:

- ``shardtop`` (the home screen: GPUs, processes, runs, presets),
- ``shardtop attach RUN`` (the run view of story 2 as recorded on two H200s,
  ``tests/fixtures/runs/h200x2``, copied into a fresh runs directory),
- ``nvitop --interval R`` (nvitop 1.7.2, the peer).

Two processes stand in for the ranks of a job, so every program has a process
table that moves: with real NVML, a CUDA process on each of the first two GPUs
(4 GiB held, a matrix product every 50 ms, as ``bench_gpu_panel.py``); with
recorded NVML, a process doing a little CPU work every 50 ms that NVML names as
the process on each GPU.  For each program the benchmark reads the pty master
as a terminal would and counts the bytes; after the first frame and 2 s to
settle it measures ``--seconds`` of bytes per second and CPU (% of one core,
the process and its children).  The first frame is the time from starting the
process until the screen's text holds the GPU name, a stand-in's pid and (for
shardtop's home) the preset list: a complete screen, not a blank one.

NVML: ``real`` uses the driver (a GPU machine); ``recorded`` replays the two
H200s' recorded samples through ``pynvml`` for *both* programs
(``recorded_nvml.py``), so that the comparison runs on a machine without a
driver; ``auto`` picks ``real`` where NVML starts.

``--dump DIR`` keeps each measuring window's bytes for ``screen_bytes.py``, which
tells which screen lines they went to and what they were.

``--only`` measures some of the programs (the side-by-side table needs all
three; without nvitop installed, ``--only home attach``); ``--attach-run``
attaches to a copy of another run directory (a long run with many events).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench.recorded_nvml import write_samples  # noqa: E402
from bench.terminal import Terminal  # noqa: E402
from tests.support.recorded import copy_runs  # noqa: E402

RANK = """
import time
while True:
    sum(i * i for i in range(20000))
    time.sleep(0.05)
"""
"""A stand-in for a training rank on the CPU side: a few % of a core, always moving."""
RUN = "h200x2/zero3-linear"
SETTLE = 2.0


@dataclass(frozen=True)
class Figures:
    first_frame: float
    cpu: float
    """% of one core."""
    rate: float
    """Bytes per second to the terminal."""


@dataclass(frozen=True)
class Program:
    name: str
    argv: list[str]
    needles: tuple[bytes, ...]
    env: dict[str, str]


def programs(refresh: float, nvml: str, samples: Path, runs: Path, run: Path, pid: int) -> list[Program]:
    python = [sys.executable, str(HERE / "recorded_nvml.py"), str(samples)] if nvml == "recorded" else [sys.executable]
    peer = [*python, "-m", "nvitop"]
    env = {
        "SHARDTOP_REFRESH": str(refresh),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    gpu, who = b"H200" if nvml == "recorded" else b"", str(pid).encode()
    return [
        Program("shardtop home", [*python, "-m", "shardtop", "--runs-dir", str(runs)], (gpu, who, b"Presets"), env),
        Program(
            "shardtop attach",
            [*python, "-m", "shardtop", "attach", str(run), "--runs-dir", str(runs)],
            (b"zero3-linear", b"model.net", b"OOM"),
            env,
        ),
        Program("nvitop", [*peer, "--interval", str(refresh)], (gpu, who, b"Processes"), {}),
    ]


def measure(program: Program, size: tuple[int, int], seconds: float, dump: Path | None = None) -> Figures:
    """``program``'s figures; with ``dump``, the bytes of the measuring window go to ``dump`` and its reads to
    ``dump.times`` (for ``screen_bytes.py``)."""
    term = Terminal(program.argv, size=size, env=program.env)
    try:
        first = term.wait_for(*(n for n in program.needles if n), timeout=60)
        time.sleep(SETTLE)
        start = term.written
        cpu, rate = term.measure(seconds)
        if dump is not None:
            data, reads = term.window(start, term.written)
            dump.write_bytes(data)
            dump.with_suffix(".times").write_text("".join(f"{t:.4f} {n}\n" for t, n in reads))
    finally:
        term.close()
    return Figures(first, cpu, rate)


def nvml_kind(asked: str) -> str:
    if asked != "auto":
        return asked
    from shardtop.gpus import gpu_count

    return "real" if gpu_count() else "recorded"


def start_ranks(nvml: str, seconds: float) -> list[subprocess.Popen[bytes]]:
    """Two stand-ins for a job's ranks: CPU loops for recorded NVML, one CUDA load per GPU (up to 2) for real."""
    if nvml == "recorded":
        return [subprocess.Popen([sys.executable, "-c", RANK]) for _ in range(2)]
    from bench.bench_gpu_panel import GPU_LOAD
    from shardtop.gpus import gpu_count

    loads = [
        subprocess.Popen(
            [sys.executable, "-c", GPU_LOAD, "4", str(seconds)], env={**os.environ, "CUDA_VISIBLE_DEVICES": str(i)}
        )
        for i in range(min(2, gpu_count()))
    ]
    time.sleep(6)  # CUDA context and the allocation
    return loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="measuring window per program and refresh")
    parser.add_argument("--size", default="120x40", help="terminal COLUMNSxLINES")
    parser.add_argument("--nvml", choices=("auto", "real", "recorded"), default="auto")
    parser.add_argument("--refresh", type=float, nargs="+", default=[1.0, 0.25])
    parser.add_argument("--only", nargs="+", choices=("home", "attach", "nvitop"), help="measure only these")
    parser.add_argument("--dump", type=Path, help="write each measuring window's bytes here (see screen_bytes.py)")
    parser.add_argument("--attach-run", type=Path, help=f"the run directory to attach to (default: {RUN})")
    args = parser.parse_args()
    columns, lines = (int(x) for x in args.size.split("x"))
    nvml = nvml_kind(args.nvml)
    chosen = tuple(args.only or ("home", "attach", "nvitop"))
    windows = len(args.refresh) * len(chosen) * (args.seconds + SETTLE + 8)
    ranks = start_ranks(nvml, windows + 60)
    results: dict[tuple[str, float], Figures] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = Path(tmp) / "runs"
            if args.attach_run is None:
                run = copy_runs(runs, RUN)[RUN]
            else:
                run = runs / args.attach_run.name
                shutil.copytree(args.attach_run, run)
            samples = write_samples(Path(tmp) / "nvml.json", [r.pid for r in ranks])
            print(
                f"SSH traffic - {columns}x{lines} pty, {args.seconds:.0f} s per program, {os.cpu_count()} cores, "
                f"NVML {'recorded (2 x H200, story 2 set-up, replayed 1 sample/s)' if nvml == 'recorded' else 'real'}"
            )
            for refresh in args.refresh:
                for program in programs(refresh, nvml, samples, runs, run, ranks[0].pid):
                    if program.name.split()[-1] not in chosen:
                        continue
                    dump = None
                    if args.dump is not None:
                        args.dump.mkdir(parents=True, exist_ok=True)
                        dump = args.dump / f"{program.name.split()[-1]}-{refresh:g}s.bytes"
                    figures = measure(program, (columns, lines), args.seconds, dump)
                    results[program.name, refresh] = figures
                    print(
                        f"  {refresh:>4} s  {program.name:<16} first frame {figures.first_frame:5.2f} s  "
                        f"CPU {figures.cpu:5.2f} %  {figures.rate / 1024:6.2f} KiB/s",
                        flush=True,
                    )
    finally:
        for r in ranks:
            r.kill()
            r.wait()
    if len(chosen) == 3:
        print_table(results, args.refresh)


def print_table(results: dict[tuple[str, float], Figures], refreshes: list[float]) -> None:
    ours = ("shardtop home", "shardtop attach")
    print()
    print(f"| | {' | '.join(ours)} | nvitop | {' | '.join(f'{o.split()[1]} / nvitop' for o in ours)} |")
    print("|---|" + "---|" * (2 * len(ours) + 1))
    rows: list[tuple[str, str, float, str]] = []
    for refresh in refreshes:
        rows.append((f"bytes to the terminal, {refresh:g} s refresh", "rate", refresh, "KiB/s"))
        rows.append((f"CPU, {refresh:g} s refresh", "cpu", refresh, "%"))
    for label, field, refresh, unit in rows:
        scale = 1024 if unit == "KiB/s" else 1
        values = [getattr(results[name, refresh], field) / scale for name in (*ours, "nvitop")]
        peer = values[-1]
        cells = [f"{v:.2f} {unit}" for v in values]
        ratios = [f"{v / peer:.2f}" if peer else "-" for v in values[:-1]]
        print(f"| {label} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    first = [results[name, refreshes[0]].first_frame for name in (*ours, "nvitop")]
    print(
        f"| first frame ({refreshes[0]:g} s refresh) | {' | '.join(f'{f:.2f} s' for f in first)} | "
        f"{' | '.join(f'{f / first[-1]:.2f}' for f in first[:-1])} |"
    )


if __name__ == "__main__":
    main()
