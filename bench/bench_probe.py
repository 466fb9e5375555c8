"""What the probe costs a training step, and what a huge model's tree costs to write.

1. Step time with and without the probe, side by side in one process, on a
   model of >= 1000 modules: blocks of steps alternate (off, on, off, on...)
   so drift of the machine hits both alike; the ratio of medians is printed.
   "With" means what a preset run has: the rank's events (phase x3 + step per
   step), the memory sampler thread at 2 Hz, and OOM attribution armed.
2. Tree + shards of a 100 000-module model: read, encode and write time, and
   bytes on disk per rank.

    python bench/bench_probe.py [--device cuda] [--blocks 8] [--steps 25]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def model_of(n_blocks: int, width: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(n_blocks):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.GELU(), nn.Dropout(0.0)]
    return nn.Sequential(*layers)


def step_times(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int, probe: bool) -> list[float]:
    import shardtop.probe as st

    times = []
    for i in range(steps):
        if x.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if probe:
            st.phase("forward", i)
        loss = model(x).pow(2).mean()
        if probe:
            st.phase("backward")
        loss.backward()
        if probe:
            st.phase("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        if x.is_cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        if probe:
            st.step(i, loss=float(loss.detach()), seconds=elapsed)
        times.append(elapsed)
    return times


def bench_overhead(device: str, blocks: int, steps: int, width: int, batch: int) -> None:
    import shardtop.probe as st
    from shardtop.probe.session import current

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
        assert probe is not None
        probe.phase_name = "x"
        off: list[float] = []
        on: list[float] = []
        for _ in range(blocks):
            off += step_times(model, opt, x, steps, probe=False)
            on += step_times(model, opt, x, steps, probe=True)
        probe.exit(0)
        probe.close()
        event_bytes = sum(p.stat().st_size for p in (run_dir / "events").iterdir())
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"probe overhead on {device}: model of {n_modules} modules, batch {batch}x{width}, "
          f"{blocks} alternating blocks of {steps} steps")
    print(f"  median step without probe {m_off * 1e3:.3f} ms, with probe {m_on * 1e3:.3f} ms, "
          f"ratio {m_on / m_off:.4f} ({(m_on / m_off - 1) * 100:+.2f} %); event file {event_bytes / 1e6:.2f} MB")


def bench_big_tree(n_modules: int) -> None:
    from shardtop.events import EventWriter, event_file
    from shardtop.probe.shards import read_shards

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--modules", type=int, default=100_000)
    args = parser.parse_args()
    os.environ.pop("SHARDTOP_RUN_DIR", None)
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus, device {args.device}")
    bench_overhead(args.device, args.blocks, args.steps, args.width, args.batch)
    bench_big_tree(args.modules)


if __name__ == "__main__":
    main()
