"""Regenerate the screenshots (SVG and PNG) of shardtop's views from real recorded runs.

    python screenshots/make_screenshots.py [--out screenshots] [--only NAME ...]

The runs are the recordings committed under ``tests/fixtures/runs/`` (``h200/``:
every preset on one NVIDIA H200; ``h200-split/``: presets on one H200 with each
rank's memory split by kind; ``cpu-6ranks/``: story 2 on 6 CPU processes)
and ``tests/tui/fixtures/runs/``, diagnosed live.  NVML's answers are the samples
recorded inside those runs; the 8-GPU machine is made of them (no 8-GPU machine
was at hand; see ``tests/tui/recorded.py``).  ``home-live-nvml-*`` were taken on
the H200 itself with real NVML and are not made here.

PNGs need ``rsvg-convert`` (Debian: ``apt-get install librsvg2-bin``).  The copy
of each SVG handed to it keeps white space (Textual starts text runs with
no-break spaces, which librsvg drops otherwise) and spaces the letters so that
the local monospace font fills Textual's cells (DejaVu Sans Mono is 0.602 em
wide, Textual's cell 0.61 em: columns drift by a cell over 80 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardtop.gpus import GpuUnavailable, HostSample  # noqa: E402
from shardtop.tui.app import ShardtopApp  # noqa: E402
from shardtop.tui.screens.home import HomeScreen  # noqa: E402
from shardtop.tui.widgets.run_header import RunHeader  # noqa: E402
from shardtop.tui.widgets.shard_tree import ShardTree  # noqa: E402
from tests.support.recorded import (  # noqa: E402
    ALL_RUNS,
    EIGHT_GPU_HOST,
    H200_HOST,
    RecordedGpus,
    RecordedHost,
    copy_runs,
    eight_h200_processes,
    eight_h200s,
    h200_processes,
    recorded_h200,
)
from tests.support.waiting import settled, wait_for  # noqa: E402

SPLIT_RUNS = ("h200-split/zero3-linear-fixed", "h200-split/fsdp-auto-wrap")
KEPT_LOGITS = ROOT / "tests" / "fixtures" / "runs" / "h200-over-time" / "20261202-003210-kept-logits-56ca"
"""A loop keeping each step's logits under a 24 GiB cap, to its OOM at step 90 (one H200)."""
"""Recordings with each rank's memory split by kind (one H200), for the stacked bars."""
LAPTOP = HostSample(cpu_percent=3.0, cores=8, memory_used=6 * 2**30, memory_total=31 * 2**30)
LETTER_SPACING = "0.16px"
"""(0.61 - 0.602) em at Textual's 20 px font: what DejaVu Sans Mono lacks per cell."""


class NoDriver:
    def sample(self) -> list[Any]:
        raise GpuUnavailable("no NVIDIA driver: NVML Shared Library Not Found")


@dataclass
class Shot:
    name: str
    size: tuple[int, int]
    app: Callable[[dict[str, Path]], ShardtopApp]
    ready: Callable[[Any], Awaitable[None]]
    cwd: str = ""
    """Where the shot is taken, under the temporary directory: run directories are shown relative to it."""


def home_ready() -> Callable[[Any], Awaitable[None]]:
    """Ready once the GPU panel has replayed every recorded sample (the sparklines show the ramp)."""

    def shown(app: Any) -> bool:
        screen = app.screen
        if not isinstance(screen, HomeScreen) or screen.runs is None or screen.gpus is None:
            return False
        source = app.gpu_source
        return not isinstance(source, RecordedGpus) or source.calls > len(source.samples)

    async def ready(pilot: Any) -> None:
        await wait_for(pilot, lambda: shown(pilot.app), timeout=20, what="the home screen")
        await settled(pilot)

    return ready


def run_ready(*keys: str) -> Callable[[Any], Awaitable[None]]:
    async def ready(pilot: Any) -> None:
        screen = pilot.app.screen
        await wait_for(
            pilot,
            lambda: (
                screen.query(ShardTree)
                and screen.query_one(RunHeader).info is not None
                and screen.snapshot is not None  # type: ignore[attr-defined]
            ),
            timeout=20,
            what="the run view",
        )
        await settled(pilot)
        await pilot.press(*keys)
        await settled(pilot)

    return ready


def shots() -> list[Shot]:
    def h200_home(runs: dict[str, Path]) -> ShardtopApp:
        host = RecordedHost(H200_HOST, h200_processes())
        return ShardtopApp(root_of(runs), refresh=0.05, gpu_source=recorded_h200(ramp=True), host_probe=host)  # type: ignore[arg-type]

    def eight_gpus(runs: dict[str, Path]) -> ShardtopApp:
        host = RecordedHost(EIGHT_GPU_HOST, eight_h200_processes())
        return ShardtopApp(root_of(runs), refresh=0.05, gpu_source=eight_h200s(ramp=True), host_probe=host)  # type: ignore[arg-type]

    def no_gpu(runs: dict[str, Path]) -> ShardtopApp:
        return ShardtopApp(root_of(runs), refresh=0.05, gpu_source=NoDriver(), host_probe=RecordedHost(LAPTOP))  # type: ignore[arg-type]

    def run_view(name: str) -> Callable[[dict[str, Path]], ShardtopApp]:
        def make(runs: dict[str, Path]) -> ShardtopApp:
            host = RecordedHost(H200_HOST)
            return ShardtopApp(runs[name].parent, run=str(runs[name]), gpu_source=recorded_h200(), host_probe=host)  # type: ignore[arg-type]

        return make

    wide = (160, 48)
    return [
        Shot("home", wide, h200_home, home_ready()),
        Shot("home-80x24", (80, 24), h200_home, home_ready()),
        Shot("home-no-gpu-80x24", (80, 24), no_gpu, home_ready()),
        Shot("home-8gpus-160x48", wide, eight_gpus, home_ready()),
        Shot("home-8gpus-80x24", (80, 24), eight_gpus, home_ready()),
        Shot("story2-zero3-linear-h200", wide, run_view("h200/zero3-linear"), run_ready()),
        Shot("story2-zero3-linear-fixed-h200", wide, run_view("h200/zero3-linear-fixed"), run_ready()),
        Shot("story2-zero3-linear-2gpus-h200", wide, run_view("h200x2/zero3-linear"), run_ready()),
        Shot("story2-zero3-linear-fixed-2gpus-h200", wide, run_view("h200x2/zero3-linear-fixed"), run_ready()),
        Shot(
            "story1-fsdp-not-sharding-h200",
            wide,
            run_view("h200/fsdp-not-sharding"),
            run_ready("down", "m"),  # conv1: a layer in no FSDP unit, whole on cuda:0
        ),
        Shot(
            "story1-fsdp-auto-wrap-h200",
            wide,
            run_view("h200/fsdp-auto-wrap"),
            run_ready("down", "down", "down", "down", "enter", "down", "enter", "m"),  # transformers1, its block 0
        ),
        Shot(
            "story2-zero3-linear-6ranks-cpu",
            wide,
            run_view("cpu-6ranks/zero3-linear"),
            run_ready("down", "down", "enter", "down", "f"),  # the 96 Linear unfolded, the findings
        ),
        Shot(
            "story2-zero3-linear-fixed-6ranks-cpu",
            wide,
            run_view("cpu-6ranks/zero3-linear-fixed"),
            run_ready("down", "down", "enter", "down", "f"),
        ),
        Shot(
            "memory-zero3-linear-fixed-oom-h200",
            (120, 40),
            run_view("h200-split/zero3-linear-fixed"),
            run_ready(),  # the set-up OOM: what filled the 15 GiB at the peak and at the OOM
            cwd="split",
        ),
        Shot(
            "memory-fsdp-auto-wrap-h200",
            (120, 40),
            run_view("h200-split/fsdp-auto-wrap"),
            run_ready("c", "c"),  # a finished run, the bar magnified; the tree's columns: optimizer bytes
            cwd="split",
        ),
        Shot(
            "memory-kept-logits-oom-h200",
            (120, 40),
            run_view("h200-over-time/kept-logits"),
            run_ready(),  # growth told before the OOM; the peak mostly "kept from earlier steps"
            cwd="over-time",
        ),
        Shot("help", (100, 36), run_view("h200/zero3-linear"), run_ready("question_mark")),
        Shot(
            "run-fsdp2-cpu-80x24",
            (80, 24),
            run_view("cpu/fsdp2-mlp"),
            run_ready("down", "down", "down", "enter", "m"),
        ),
    ]


def root_of(runs: dict[str, Path]) -> Path:
    return next(iter(runs.values())).parent


async def take(shot: Shot, runs: dict[str, Path]) -> str:
    app = shot.app(runs)
    async with app.run_test(size=shot.size) as pilot:
        await shot.ready(pilot)
        return app.export_screenshot(title=f"shardtop — {shot.name}")


def to_png(svg: Path, png: Path) -> bool:
    tool = shutil.which("rsvg-convert")
    if tool is None:
        return False
    text = svg.read_text().replace("<svg ", '<svg xml:space="preserve" ', 1)
    opened = text.index(">", text.index("<svg")) + 1
    text = text[:opened] + f"<style>text {{ letter-spacing: {LETTER_SPACING}; }}</style>" + text[opened:]
    with tempfile.NamedTemporaryFile("w", suffix=".svg", delete=False) as for_librsvg:
        for_librsvg.write(text)
    try:
        subprocess.run([tool, for_librsvg.name, "-o", str(png)], check=True)
    finally:
        Path(for_librsvg.name).unlink()
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--only", nargs="*", default=None, help="names of the shots to take (default: all)")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    chosen = [s for s in shots() if args.only is None or s.name in args.only]
    with tempfile.TemporaryDirectory() as tmp:
        runs = copy_runs(Path(tmp) / "runs", *ALL_RUNS)
        runs |= copy_runs(Path(tmp) / "split" / "runs", *SPLIT_RUNS)  # kept out of the home views' run list
        kept = Path(tmp) / "over-time" / "runs" / KEPT_LOGITS.name
        shutil.copytree(KEPT_LOGITS, kept)
        runs["h200-over-time/kept-logits"] = kept
        pngs = True
        for shot in chosen:
            os.chdir(Path(tmp) / shot.cwd)  # the run view shows run directories relative to here: "runs/<id>"
            svg = out / f"{shot.name}.svg"
            svg.write_text(asyncio.run(take(shot, runs)))
            pngs = to_png(svg, out / f"{shot.name}.png") and pngs
            print(f"{svg.relative_to(ROOT) if svg.is_relative_to(ROOT) else svg}  {shot.size[0]}×{shot.size[1]}")
    if not pngs:
        print("rsvg-convert not found: SVGs only (apt-get install librsvg2-bin for the PNGs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
