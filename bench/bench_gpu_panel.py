"""The GPU panel on real NVML: a screenshot, and its CPU cost side by side with nvitop.

Run on a GPU machine (it needs a driver; nvitop is the peer, installed as a wheel):

    python bench/bench_gpu_panel.py --out DIR [--seconds 20]

1. A GPU process is started (a few GiB allocated, matrix products in a loop) so
   the panel has something to show, then shardtop's home screen is rendered
   against the real NVML at 160x48 and 80x24 and saved as SVG.
2. ``shardtop`` (home screen, 1 s refresh) and ``nvitop --interval 1`` each run
   in a pseudo-terminal of 160x48 for the same window, one after the other in
   this one run; their CPU seconds (process and children, from psutil) are
   turned into % of one core, and the ratio is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.terminal import Terminal  # noqa: E402

GPU_LOAD = """
import sys, time, torch
x = torch.randn(8192, 8192, device="cuda")
hold = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
end = time.time() + float(sys.argv[2])
while time.time() < end:
    y = x @ x
    torch.cuda.synchronize()
    time.sleep(0.05)
"""


def start_gpu_load(gib: float, seconds: float) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", GPU_LOAD, str(gib), str(seconds)])
    time.sleep(6)  # CUDA context and the allocation
    return proc


async def screenshot(out: Path, size: tuple[int, int], runs_root: Path) -> Path:
    from shardtop.tui.app import ShardtopApp

    app = ShardtopApp(runs_root=runs_root, refresh=1.0)
    async with app.run_test(size=size) as pilot:
        await pilot.pause(3.5)
        name = f"home-live-nvml-{size[0]}x{size[1]}.svg"
        app.save_screenshot(filename=name, path=str(out))
    return out / name


def cpu_percent_in_pty(argv: list[str], seconds: float, env: dict[str, str]) -> float:
    """% of one core the program used over ``seconds`` (after 3 s to start), in a 160x48 pty."""
    term = Terminal(argv, size=(160, 48), env=env)
    try:
        time.sleep(3.0)
        cpu, _rate = term.measure(seconds)
        return cpu
    finally:
        term.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from shardtop.gpus import Nvml

    nvml = Nvml()
    print(f"NVML: {nvml.count} GPU(s): {', '.join(g.name for g in nvml.sample())}")
    load = start_gpu_load(4.0, 30 + 2 * (args.seconds + 5))
    try:
        runs_root = Path(tempfile.mkdtemp())
        fixtures = ROOT / "tests" / "fixtures" / "runs" / "h200"
        if fixtures.is_dir():
            shutil.copytree(fixtures, runs_root / "runs")
            runs_root = runs_root / "runs"
        for size in ((160, 48), (80, 24)):
            print(f"screenshot: {asyncio.run(screenshot(args.out, size, runs_root))}")
        env = {**os.environ, "TERM": "xterm-256color", "SHARDTOP_REFRESH": "1", "SHARDTOP_RUNS_DIR": str(runs_root)}
        ours = cpu_percent_in_pty([sys.executable, "-m", "shardtop"], args.seconds, env)
        peer_exe = shutil.which("nvitop")
        peer_argv = [peer_exe] if peer_exe else [sys.executable, "-m", "nvitop"]
        peer = cpu_percent_in_pty([*peer_argv, "--interval", "1"], args.seconds, env)
        print(f"GPU panel CPU over {args.seconds:.0f} s at a 1 s refresh, 160x48 pty, {nvml.count} GPU(s): "
              f"shardtop home {ours:.2f} % of a core, nvitop {peer:.2f} % of a core, "
              f"ratio shardtop/nvitop {ours / peer:.2f}")
    finally:
        load.kill()


if __name__ == "__main__":
    main()
