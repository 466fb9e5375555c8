"""What the TUI costs: start-up, CPU while a run streams, a 100 000-module tree, keys, OOM latency.

1. ``shardtop --help``: wall time of the real command (median of 5).
2. First frame: ``shardtop`` and ``shardtop attach RUN`` started in a pseudo-terminal
   (160×48), time until the screen's text has arrived on the terminal.
3. CPU: ``shardtop attach RUN`` in a pseudo-terminal while another process streams
   events into RUN (2 ranks: memory every 0.5 s, phases and a step every 0.5 s);
   the TUI's CPU time over 10 s at ``SHARDTOP_REFRESH=1`` and ``0.1``, and the
   bytes it wrote to the terminal per second.  Also the home view, which samples
   NVML (on a GPU machine) and psutil every refresh.
4. 100 000-module tree: from the run view's mount to the first paint of the tree
   with the model in it, measured inside the app.
5. Key repaint latency, inside the app: from the key event reaching the app to the
   tree's first paint after it (the one that shows the change), and to its last
   (when the screen has settled: details pane re-laid out...).  The pilot's own
   ~42 ms per press is not in these figures.
6. OOM on screen: an OOM event appended to a live run's file, to the first paint
   of the tree opened at the culprit (refresh 1 s).

    python bench/bench_tui.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.terminal import Terminal  # noqa: E402
from shardtop.rundir.event_files import event_file  # noqa: E402
from shardtop.rundir.event_lines import encode  # noqa: E402
from shardtop.rundir.events import Oom  # noqa: E402
from shardtop.tui.app import ShardtopApp  # noqa: E402
from shardtop.tui.screens.run_view import ControlledRunScreen  # noqa: E402
from shardtop.tui.widgets.shard_tree import ShardTree  # noqa: E402
from tests.support.recorded import big_tree_run, fsdp2_cpu_run  # noqa: E402

_SCRIPT = Path(sys.executable).parent / "shardtop"
_FOUND = str(_SCRIPT) if _SCRIPT.exists() else shutil.which("shardtop")
SHARDTOP = [_FOUND] if _FOUND else [sys.executable, "-m", "shardtop"]
"""The installed command, as a user types it."""


# -- 1, 2, 3: the real command in a terminal ---------------------------------------------


def bench_help() -> float:
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([*SHARDTOP, "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_first_frame(root: Path, run: Path) -> tuple[float, float]:
    home = Terminal([*SHARDTOP, "--runs-dir", str(root)])
    home_s = home.wait_for(b"Presets", b"Runs")
    home.close()
    view = Terminal([*SHARDTOP, "attach", str(run), "--runs-dir", str(root)])
    view_s = view.wait_for(b"Shard", b"tree", b"model")
    view.close()
    return home_s, view_s


STREAMER = r"""
import os, sys, time
from shardtop.rundir.event_files import EventWriter, event_file  # noqa: E402
from shardtop.rundir.events import Memory, Phase, Step  # noqa: E402
from pathlib import Path
run = Path(sys.argv[1])
writers = [EventWriter(event_file(run / "events", r), r, host="bench") for r in (0, 1)]
step = 0
while True:
    step += 1
    for w in writers:
        w.write(Phase(phase="forward", step=step))
        w.write(Memory(device="cpu", host_rss=400_000_000 + (step % 50) * 1_000_000))
        w.write(Phase(phase="backward", step=step))
        w.write(Step(step=step, loss=1.0 / step, seconds=0.5))
    time.sleep(0.5)
"""


def live_run(root: Path, pid: int) -> Path:
    """A finished recorded run turned live: no exit record, the streamer as its process."""
    run = fsdp2_cpu_run(root, steps=1)
    (run / "exit.json").unlink()
    import json

    meta = json.loads((run / "run.json").read_text())
    meta.update(pid=pid, pid_started=psutil.Process(pid).create_time())
    (run / "run.json").write_text(json.dumps(meta))
    return run


def bench_home_cpu(seconds: float, refresh: float) -> float:
    """Percent of one core the home view uses: NVML (where there is a driver) and psutil every refresh."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fsdp2_cpu_run(root)
        term = Terminal([*SHARDTOP, "--runs-dir", str(root)], env={"SHARDTOP_REFRESH": str(refresh)})
        try:
            term.wait_for(b"Presets", b"Runs")
            time.sleep(2.0)
            proc = psutil.Process(term.proc.pid)
            c0, t0 = proc.cpu_times(), time.perf_counter()
            time.sleep(seconds)
            c1, t1 = proc.cpu_times(), time.perf_counter()
        finally:
            term.close()
        return (c1.user + c1.system - c0.user - c0.system) / (t1 - t0) * 100


def bench_cpu(seconds: float, refresh: float) -> tuple[float, float]:
    """Percent of one core used by the TUI, and terminal bytes per second, while events stream."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        run = live_run(root, sleeper.pid)
        streamer = subprocess.Popen([sys.executable, "-c", STREAMER, str(run)], cwd=ROOT)
        term = Terminal(
            [*SHARDTOP, "attach", str(run), "--runs-dir", str(root)], env={"SHARDTOP_REFRESH": str(refresh)}
        )
        try:
            term.wait_for(b"Shard", b"model")
            time.sleep(2.0)
            proc = psutil.Process(term.proc.pid)
            c0, b0, t0 = proc.cpu_times(), term.written, time.perf_counter()
            time.sleep(seconds)
            c1, b1, t1 = proc.cpu_times(), term.written, time.perf_counter()
        finally:
            term.close()
            streamer.kill()
            sleeper.kill()
            streamer.wait()
            sleeper.wait()
        cpu = (c1.user + c1.system - c0.user - c0.system) / (t1 - t0) * 100
        return cpu, (b1 - b0) / (t1 - t0)


# -- 4, 5, 6: inside the app ------------------------------------------------------------------


class Timings:
    def __init__(self) -> None:
        self.paints: list[tuple[float, bool]] = []
        """(time, had a model) of every tree paint."""
        self.mounted = 0.0
        self.keys: list[tuple[str, float]] = []
        self.oom_handled = 0.0


def instrument(timings: Timings) -> type[ShardtopApp]:
    """The app, reporting when the run view mounts, keys arrive, the tree paints, an OOM is handled."""
    original = ShardTree.render_lines

    def render_lines(self: ShardTree, crop: Any) -> Any:
        strips = original(self, crop)
        timings.paints.append((time.perf_counter(), self.model is not None))
        return strips

    ShardTree.render_lines = render_lines  # type: ignore[method-assign]

    class TimedRunScreen(ControlledRunScreen):
        # Textual calls each class's handler in the MRO: these run first, then the real ones.
        def on_mount(self) -> None:
            timings.mounted = time.perf_counter()

        def on_run_screen_updated(self, message: ControlledRunScreen.Updated) -> None:
            if message.snapshot.model.ooms and not timings.oom_handled:
                timings.oom_handled = time.perf_counter()

    class TimedApp(ShardtopApp):
        def _run_screen(self, run: Any) -> TimedRunScreen:
            return TimedRunScreen(run, refresh=self.refresh_s, read_only=self.read_only, clock=self.clock)

        async def on_event(self, event: Any) -> None:
            from textual import events

            if isinstance(event, events.Key):
                timings.keys.append((event.key, time.perf_counter()))
            await super().on_event(event)

    return TimedApp


async def bench_tree_and_keys(root: Path) -> tuple[float, dict[str, tuple[float, float]]]:
    """Load time, and per key (first paint, last paint) after the key reached the app."""
    run = big_tree_run(root)
    timings = Timings()
    app = instrument(timings)(root, run=str(run))
    latencies: dict[str, list[float]] = {}
    settled: dict[str, list[float]] = {}
    async with app.run_test(size=(160, 48)) as pilot:
        while not any(model for _, model in timings.paints):
            await pilot.pause(0.01)
        load = next(t for t, model in timings.paints if model) - timings.mounted
        plan = [
            ("down", "down (onto the fold)", 1),
            ("enter", "enter: open 19 999 blocks", 1),
            ("down", "down", 30),
            ("up", "up", 10),
            ("pagedown", "pagedown", 10),
            ("end", "end", 1),
            ("right", "right: open a block", 1),
            ("home", "home", 1),
            ("down", "down", 1),
            ("enter", "enter: close 19 999 blocks", 1),
            ("slash", "/ (search bar)", 1),
            *[(ch, "search keystroke (100k paths)", 1) for ch in "1234.fc"],
            ("enter", "enter: jump to the match", 1),
        ]
        for key, label, times in plan:
            for _ in range(times):
                await pilot.press(key)
                await pilot.pause(0.1)
                sent = timings.keys[-1][1]
                painted = [t for t, _ in timings.paints if t >= sent]
                if painted:
                    latencies.setdefault(label, []).append(min(painted) - sent)
                    settled.setdefault(label, []).append(max(painted) - sent)
    return load, {k: (statistics.median(v), statistics.median(settled[k])) for k, v in latencies.items()}


async def bench_oom(root: Path, trials: int = 3) -> list[float]:
    out = []
    for trial in range(trials):
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        run = live_run(root / f"oom{trial}", sleeper.pid)
        timings = Timings()
        app = instrument(timings)(root / f"oom{trial}", run=str(run), refresh=1.0)
        try:
            async with app.run_test(size=(160, 48)) as pilot:
                while not any(model for _, model in timings.paints):
                    await pilot.pause(0.01)
                await pilot.pause(0.3 + trial * 0.37)  # land at different points of the refresh cycle
                written = time.perf_counter()
                with open(event_file(run / "events", 1), "ab") as f:
                    f.write(
                        encode(
                            Oom(
                                phase="forward",
                                module="layers.3",
                                module_type="Linear",
                                rank=1,
                                host="bench",
                                t=time.time(),
                            )
                        )
                    )
                while not timings.oom_handled:
                    await pilot.pause(0.005)
                await pilot.pause(0.1)
                out.append(min(t for t, _ in timings.paints if t >= timings.oom_handled) - written)
        finally:
            sleeper.kill()
            sleeper.wait()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="CPU measuring window per refresh setting")
    args = parser.parse_args()
    print(f"shardtop TUI benchmark - {os.cpu_count()} cores, python {sys.version.split()[0]}")
    print(f"shardtop --help            {bench_help():6.3f} s   (target <= 0.3 s)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run = fsdp2_cpu_run(root)
        home_s, view_s = bench_first_frame(root, run)
        print(f"first frame, home          {home_s:6.3f} s   (target <= 1 s; process start to screen text)")
        print(f"first frame, run view      {view_s:6.3f} s")
    from shardtop.gpus import gpu_count

    gpus = gpu_count()
    for refresh in (1.0, 0.1):
        target = 2 if refresh == 1.0 else 5
        cpu, rate = bench_cpu(args.seconds, refresh)
        print(
            f"CPU, run view streaming, {refresh:>3} s refresh  {cpu:6.2f} % of a core (target <= {target} %); "
            f"{rate / 1024:.1f} KiB/s to the terminal"
        )
        home = bench_home_cpu(args.seconds, refresh)
        print(f"CPU, home view ({gpus} GPU(s)), {refresh:>3} s refresh  {home:6.2f} % of a core (target <= {target} %)")
    with tempfile.TemporaryDirectory() as tmp:
        load, keys = asyncio.run(bench_tree_and_keys(Path(tmp)))
        print(f"100 000-module tree load   {load:6.3f} s   (target <= 1 s; run view mount to painted tree)")
        print("key repaint, in-app, median (target <= 50 ms): first paint showing it / last paint it caused")
        for key, (first, last) in keys.items():
            print(f"  {key:<32} {first * 1000:6.1f} ms / {last * 1000:6.1f} ms")
    with tempfile.TemporaryDirectory() as tmp:
        ooms = asyncio.run(bench_oom(Path(tmp)))
        print(
            f"OOM event to screen        {max(ooms):6.3f} s   (target <= 1 s; worst of "
            f"{', '.join(f'{o:.3f}' for o in ooms)} at 1 s refresh)"
        )


if __name__ == "__main__":
    main()
