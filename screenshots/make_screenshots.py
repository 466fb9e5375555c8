"""Regenerate the screenshots (SVG and PNG) of shardtop's main views from recorded runs.

    python screenshots/make_screenshots.py [--out screenshots]

Runs recorded with the real probe (``tests/fixtures/runs/``, ``tests/tui/fixtures/runs/``)
are used as they are; where CI cannot record one (a GPU OOM of story 2), the
recorded-content builders of ``tests/tui/recorded.py`` stand in, and a real
recording in ``tests/fixtures/runs/`` (a ``zero3-linear`` run with an OOM)
replaces them once it exists.  NVML's and psutil's answers are recorded too.

PNGs need ``rsvg-convert`` (Debian: ``apt-get install librsvg2-bin``).  Textual's
SVGs put spaces as no-break spaces at the start of text runs, which librsvg
drops unless told to keep white space, so the copy handed to it says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

from shardtop.events import read_all  # noqa: E402
from shardtop.gpus import GpuUnavailable, HostSample  # noqa: E402
from shardtop.tui.app import ShardtopApp  # noqa: E402
from shardtop.tui.screens.home import HomeScreen  # noqa: E402
from shardtop.tui.widgets.run_header import RunHeader  # noqa: E402
from shardtop.tui.widgets.shard_tree import ShardTree  # noqa: E402
from tests.tui.recorded import (  # noqa: E402
    HOST,
    RAMP_GIB,
    RecordedHost,
    h200_pair,
    h200_processes,
    zero3_oom_run,
)

FIXTURES = (ROOT / "tests" / "fixtures" / "runs", ROOT / "tests" / "tui" / "fixtures" / "runs")
LAPTOP = HostSample(cpu_percent=3.0, cores=8, memory_used=6 * 2**30, memory_total=31 * 2**30)


class NoDriver:
    def sample(self) -> list[Any]:
        raise GpuUnavailable("no NVIDIA driver: NVML Shared Library Not Found")


@dataclass
class Shot:
    name: str
    size: tuple[int, int]
    app: Callable[[Path], ShardtopApp]
    ready: Callable[[Any], Awaitable[None]]


async def until(pilot: Any, condition: Callable[[], object], timeout: float = 20.0) -> None:
    waited = 0.0
    while not condition():
        if waited > timeout:
            raise TimeoutError(f"screen not ready after {timeout}s")
        await pilot.pause(0.05)
        waited += 0.05


def home_ready(samples: int) -> Callable[[Any], Awaitable[None]]:
    """Ready once the GPU panel holds ``samples`` samples of history (the recorded ramp)."""

    def shown(app: Any) -> bool:
        screen = app.screen
        if not isinstance(screen, HomeScreen) or screen.runs is None or screen.gpus is None:
            return False
        history = screen.gpus.history
        return not samples or (bool(history) and len(history[0]) >= samples)

    async def ready(pilot: Any) -> None:
        await until(pilot, lambda: shown(pilot.app))
        await pilot.pause(0.2)

    return ready


def run_ready(*keys: str) -> Callable[[Any], Awaitable[None]]:
    async def ready(pilot: Any) -> None:
        screen = pilot.app.screen
        await until(
            pilot,
            lambda: (
                screen.query(ShardTree)
                and screen.query_one(ShardTree).model is not None
                and screen.query_one(RunHeader).info is not None
            ),
        )
        await pilot.press(*keys)
        await pilot.pause(0.3)

    return ready


def recorded_runs(root: Path) -> dict[str, Path]:
    """The runs to show, by role: real recordings where there are any, else recorded-content builders."""
    roles: dict[str, Path] = {}
    for base in FIXTURES:
        for meta in sorted(base.glob("*/run.json")):
            run = meta.parent
            preset = json.loads(meta.read_text()).get("preset", "")
            target = root / run.name
            if not target.exists():
                shutil.copytree(run, target)
            if preset == "fsdp2-mlp":
                roles.setdefault("fsdp2", target)
            if preset == "zero3-linear" and any(type(e).__name__ == "Oom" for e in read_all(run / "events")[0]):
                roles.setdefault("oom", target)
    if "oom" not in roles:
        roles["oom"] = zero3_oom_run(root)
    return roles


def shots(runs: dict[str, Path]) -> list[Shot]:
    def gpu_app(root: Path, run: str | None = None) -> ShardtopApp:
        return ShardtopApp(
            root,
            run=run,
            refresh=0.05,
            gpu_source=h200_pair(ramp=True),  # type: ignore[arg-type]
            host_probe=RecordedHost(HOST, h200_processes()),
        )  # type: ignore[arg-type]

    out = [
        Shot("home", (160, 48), gpu_app, home_ready(len(RAMP_GIB))),
        Shot("home-80x24", (80, 24), gpu_app, home_ready(len(RAMP_GIB))),
        Shot(
            "home-no-gpu-80x24",
            (80, 24),
            lambda root: ShardtopApp(root, refresh=0.05, gpu_source=NoDriver(), host_probe=RecordedHost(LAPTOP)),  # type: ignore[arg-type]
            home_ready(0),
        ),
        Shot("run-oom", (160, 48), lambda root: gpu_app(root, str(runs["oom"])), run_ready()),
        Shot("run-oom-80x24", (80, 24), lambda root: gpu_app(root, str(runs["oom"])), run_ready()),
        Shot(
            "run-oom-search-80x24",
            (80, 24),
            lambda root: gpu_app(root, str(runs["oom"])),
            run_ready("slash", *"net.12", "enter", "n"),
        ),
        Shot("help", (100, 36), lambda root: gpu_app(root, str(runs["oom"])), run_ready("question_mark")),
    ]
    if "fsdp2" in runs:
        out += [
            Shot(
                "run-fsdp2-cpu",
                (160, 48),
                lambda root: gpu_app(root, str(runs["fsdp2"])),
                run_ready("down", "down", "enter", "down", "down", "m"),
            ),
            Shot(
                "run-fsdp2-cpu-80x24",
                (80, 24),
                lambda root: gpu_app(root, str(runs["fsdp2"])),
                run_ready("down", "down", "enter", "down", "m"),
            ),
        ]
    return out


async def take(shot: Shot, root: Path) -> str:
    app = shot.app(root)
    async with app.run_test(size=shot.size) as pilot:
        await shot.ready(pilot)
        return app.export_screenshot(title=f"shardtop — {shot.name}")


def to_png(svg: Path, png: Path) -> bool:
    tool = shutil.which("rsvg-convert")
    if tool is None:
        return False
    with tempfile.NamedTemporaryFile("w", suffix=".svg", delete=False) as keep_spaces:
        keep_spaces.write(svg.read_text().replace("<svg ", '<svg xml:space="preserve" ', 1))
    try:
        subprocess.run([tool, keep_spaces.name, "-o", str(png)], check=True)
    finally:
        Path(keep_spaces.name).unlink()
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the run view shows run directories relative to here: "runs/<id>"
        root = Path(tmp) / "runs"
        root.mkdir(mode=0o700)
        runs = recorded_runs(root)
        pngs = True
        for shot in shots(runs):
            svg = out / f"{shot.name}.svg"
            svg.write_text(asyncio.run(take(shot, root)))
            pngs = to_png(svg, out / f"{shot.name}.png") and pngs
            print(f"{svg.relative_to(ROOT) if svg.is_relative_to(ROOT) else svg}  {shot.size[0]}×{shot.size[1]}")
    if not pngs:
        print("rsvg-convert not found: SVGs only (apt-get install librsvg2-bin for the PNGs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
