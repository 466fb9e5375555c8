"""The plain first frame: the GPUs at once, before Textual; the terminal as it was on every way out.

The frame's lines are checked as a user reads them (pure, on the recorded
eight-H200 machine).  tests/engines/test_first_frame_terminal.py runs the real
``shardtop`` in a pseudo-terminal and reads the bytes a terminal would get.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shardtop.config import preset_names
from shardtop.gpus import GpuProcessInfo
from shardtop.tui import first_frame
from shardtop.tui.first_frame import FirstLook, frame_lines, painted
from tests.support.recorded import (
    TRAINER_PIDS,
    eight_h200_processes,
    eight_h200s,
)

ROOT = Path(__file__).resolve().parents[2]


def eight_gpus() -> FirstLook:
    processes = eight_h200_processes()
    return FirstLook(
        gpus=tuple(eight_h200s().sample()),
        processes=tuple(processes[pid] for pid in (*TRAINER_PIDS, *sorted(set(processes) - set(TRAINER_PIDS)))),
        presets=tuple(preset_names()),
    )


def test_the_frame_holds_the_gpus_their_processes_and_the_presets() -> None:
    lines = frame_lines(eight_gpus(), 120, 40)
    text = "\n".join(lines)
    assert len(lines) <= 40 and all(len(line) <= 120 for line in lines)
    assert "GPUs (8)" in lines
    gpu_lines = [line for line in lines if "H200" in line]
    assert len(gpu_lines) == 8
    assert " 0 H200" in gpu_lines[0] and "14.2/ 140.4 GiB" in gpu_lines[0] and "58°C" in gpu_lines[0]
    assert "█" in gpu_lines[0] and "░" in gpu_lines[6], "busy and idle GPUs as bars"
    assert all(str(pid) in text for pid in TRAINER_PIDS), "every rank's pid"
    assert "python train.py" in text and "alice (other user)" in text
    assert "RUN / RANK" not in text, "which run a process is comes with the home screen, not before"
    assert " ".join(preset_names()) in " ".join(text.split())


def test_on_a_small_terminal_the_processes_give_up_lines_first() -> None:
    lines = frame_lines(eight_gpus(), 80, 24)
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert sum("H200" in line for line in lines) == 8 and "14.2/140G" in lines[2], "every GPU, in short figures"
    assert all(str(pid) in "\n".join(lines) for pid in TRAINER_PIDS)
    assert lines[-3] == "Presets" and lines[-2].startswith(" ddp-baseline"), "presets wrap, never cut"
    assert " ".join(preset_names()) in " ".join(" ".join(lines[-2:]).split())
    shorter = frame_lines(eight_gpus(), 80, 18)
    assert len(shorter) == 18 and sum("H200" in line for line in shorter) == 8
    assert shorter[-4] == " … 7 in all", "the processes left out are counted"
    assert shorter[-3:] == lines[-3:], "the presets stay"


def test_a_command_line_cannot_move_the_cursor_or_clear_the_screen() -> None:
    first = eight_gpus()
    sneaky = GpuProcessInfo(
        4242, (0,), 2**30, "own", "me", "python -c '\nimport os'\x1b[2J\x1b[1;1Hgotcha", None, 2**30
    )
    lines = frame_lines(FirstLook(first.gpus[:1], (sneaky,), first.presets), 120, 40)
    row = next(line for line in lines if line.startswith(" 4242"))
    assert "\x1b" not in "".join(lines) and "\n" not in "".join(lines)
    assert "python -c ' import os' [2J [1;1Hgotcha" in row


def test_nothing_is_written_where_stdout_is_not_a_terminal() -> None:
    out = io.StringIO()
    with painted(out) as driver:
        pass
    assert driver is None and out.getvalue() == ""


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_ctrl_z_is_ignored_only_while_the_frame_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shell must never get the terminal while it is on the frame's alternate screen."""
    monkeypatch.setattr(first_frame, "look", eight_gpus)
    before = signal.getsignal(signal.SIGTSTP)
    out = FakeTerminal()
    with painted(out) as driver:
        during = signal.getsignal(signal.SIGTSTP)
        assert driver is not None and out.getvalue().startswith(first_frame.ENTER) and "GPUs (8)" in out.getvalue()
    assert during == signal.SIG_IGN
    assert signal.getsignal(signal.SIGTSTP) == before
    assert out.getvalue().endswith(first_frame.LEAVE)


def test_help_imports_neither_textual_nor_torch_and_the_frame_needs_no_textual() -> None:
    code = (
        "import contextlib, io, sys\n"
        "from shardtop import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    cli.main(['--help'])\n"
        "import shardtop.tui.first_frame\n"
        "print(sorted(m for m in ('textual', 'torch') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
