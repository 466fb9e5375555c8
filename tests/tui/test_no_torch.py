"""The TUI process never imports torch, lightning or deepspeed — not even indirectly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import asyncio, importlib, json, pkgutil, sys, tempfile
from pathlib import Path
import shardtop.tui as tui
for module in pkgutil.walk_packages(tui.__path__, "shardtop.tui."):
    importlib.import_module(module.name)
# what the launch prompt's ctrl+r and ctrl+f import to start a rehearsal or a fit (shardtop.tui.screens.home)
for name in ("shardtop.rehearse.command", "shardtop.rehearse.spec", "shardtop.rehearse.start", "shardtop.headless",
             "shardtop.launch", "shardtop.gpus", "shardtop.fit.request", "shardtop.fit.detached"):
    importlib.import_module(name)
from shardtop.tui.app import ShardtopApp
from tests.support.recorded import copy_runs
from tests.support.waiting import wait_for

def shown(screen):  # the home screen with its GPUs and runs, or a run's view with its first snapshot
    home = getattr(screen, "gpus", None) is not None and getattr(screen, "runs", None) is not None
    return home or getattr(screen, "snapshot", None) is not None

async def main():
    root = Path(tempfile.mkdtemp())
    runs = copy_runs(root, "h200/zero3-linear-fixed", "cpu-6ranks/zero3-linear")
    for target in (None, *map(str, runs.values())):
        app = ShardtopApp(root, run=target)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: shown(app.screen), timeout=60, what="the screen's first data")
            await pilot.press("question_mark", "escape", "o")
asyncio.run(main())
print(json.dumps(sorted(n for n in ("torch", "lightning", "deepspeed", "pytorch_lightning") if n in sys.modules)))
"""


def test_tui_process_imports_no_training_library() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
