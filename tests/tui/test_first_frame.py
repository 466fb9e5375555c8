"""The plain first frame: the GPUs at once, before Textual; the terminal as it was on every way out.

The frame's lines are checked as a user reads them (pure, on the recorded
eight-H200 machine).  The rest runs the real ``shardtop`` in a pseudo-terminal
with NVML answering from story 2's two-H200 recording (``bench/recorded_nvml.py``,
as ``bench_ssh.py`` runs it) and reads the bytes a terminal would get.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.recorded_nvml import write_samples
from bench.terminal import Terminal
from shardtop.config import preset_names
from shardtop.gpus import GpuProcessInfo
from shardtop.tui import first_frame
from shardtop.tui.first_frame import ALTERNATE_SCREEN, FirstLook, frame_lines, painted
from tests.support.recorded import (
    TRAINER_PIDS,
    copy_runs,
    eight_h200_processes,
    eight_h200s,
)

ROOT = Path(__file__).resolve().parents[2]
LEAVE_ALTERNATE = b"\x1b[?1049l"
TEXTUAL_STARTED = b"\x1b[?1000h"
"""Textual's driver turns mouse reporting on as it starts; the first frame never does."""


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


# -- the real command in a pseudo-terminal -------------------------------------------------------------------


@pytest.fixture
def recorded_nvml(tmp_path: Path) -> Path:
    """Story 2's two H200s replayed through pynvml; this test's own process is the one on both GPUs."""
    return write_samples(tmp_path / "nvml.json", [os.getpid(), os.getpid()])


def shardtop_in_a_terminal(
    samples: Path, runs: Path, *, module: str = "shardtop", extra: Path | None = None
) -> Terminal:
    path = os.pathsep.join(str(p) for p in (ROOT, extra) if p is not None)
    argv = [
        sys.executable, str(ROOT / "bench" / "recorded_nvml.py"), str(samples), "-m", module, "--runs-dir", str(runs)
    ]
    return Terminal(argv, size=(120, 40), env={"PYTHONPATH": path, "SHARDTOP_REFRESH": "1"})


def wait_for_exit(term: Terminal, timeout: float = 10.0) -> int:
    code = term.proc.wait(timeout)
    deadline = time.monotonic() + 2
    while term._reader.is_alive() and time.monotonic() < deadline:  # the last bytes drained
        time.sleep(0.02)
    return code


def assert_restored(output: bytes) -> None:
    """Back on the main screen, cursor shown, lines wrapping, as every full-screen program leaves a terminal."""
    assert output.count(ALTERNATE_SCREEN.encode()) == output.count(LEAVE_ALTERNATE) == 1, output[-400:]
    for off, on in ((b"\x1b[?25l", b"\x1b[?25h"), (b"\x1b[?7l", b"\x1b[?7h")):
        assert output.rfind(on) > output.rfind(off), (off, on, output[-400:])


def test_the_frame_comes_before_textual_and_stays_until_textual_paints_over_it(
    tmp_path: Path, recorded_nvml: Path
) -> None:
    copy_runs(tmp_path / "runs", "h200x2/zero3-linear")
    term = shardtop_in_a_terminal(recorded_nvml, tmp_path / "runs")
    try:
        term.wait_for(b"H200", str(os.getpid()).encode(), b"zero3-linear-fixed", timeout=60)
        term.wait_for(b"Enter launches", timeout=60)  # Textual's home screen: the preset list's title
        term.wait_for(b"Quit", timeout=30)  # its footer
        with term._lock:
            output = bytes(term.output)
    finally:
        term.close()
    code = wait_for_exit(term)
    textual = output[output.index(TEXTUAL_STARTED):]
    frame = output[: output.index(TEXTUAL_STARTED)].decode()
    assert all(w in frame for w in ("H200", str(os.getpid()), "zero3-linear-fixed")), "the frame came first, whole"
    assert ALTERNATE_SCREEN.encode() not in textual and b"\x1b[2J" not in textual, "nothing blanks the frame"
    assert code == 0, term.screen_text()[-3000:]
    assert_restored(bytes(term.output))


def test_q_pressed_while_the_frame_is_up_quits_and_restores_the_terminal(tmp_path: Path, recorded_nvml: Path) -> None:
    term = shardtop_in_a_terminal(recorded_nvml, tmp_path / "runs")
    try:
        term.wait_for(b"H200", b"Presets", timeout=60)
        with term._lock:
            pressed_before_textual = TEXTUAL_STARTED not in term.output
        os.write(term.master, b"q")
        code = wait_for_exit(term, timeout=30)
    finally:
        term.close()
    assert pressed_before_textual, "q was pressed while only the plain frame was up"
    assert code == 0, term.screen_text()[-3000:]
    assert_restored(bytes(term.output))


BROKEN = """
import shardtop.tui.app
from shardtop import cli


def broken(**_settings):
    raise ImportError("textual is broken here")


shardtop.tui.app.run_app = broken
raise SystemExit(cli.main())
"""
WAITING = """
import sys, time
from shardtop.tui.first_frame import painted

with painted():
    print("frame up", file=sys.stderr, flush=True)
    time.sleep(30)
"""


def test_when_textual_fails_to_start_the_terminal_is_restored_and_the_error_readable(
    tmp_path: Path, recorded_nvml: Path
) -> None:
    (tmp_path / "broken_start.py").write_text(BROKEN)
    term = shardtop_in_a_terminal(recorded_nvml, tmp_path / "runs", module="broken_start", extra=tmp_path)
    try:
        code = wait_for_exit(term, timeout=60)
    finally:
        term.close()
    output = bytes(term.output)
    assert code == 1
    assert output.index(b"Presets") < output.index(LEAVE_ALTERNATE) < output.index(b"textual is broken here")
    assert_restored(output)


def test_ctrl_c_while_the_frame_is_up_restores_the_terminal(tmp_path: Path, recorded_nvml: Path) -> None:
    (tmp_path / "waiting.py").write_text(WAITING)
    term = shardtop_in_a_terminal(recorded_nvml, tmp_path / "runs", module="waiting", extra=tmp_path)
    try:
        term.wait_for(b"frame up", timeout=60)
        os.kill(term.proc.pid, signal.SIGINT)  # what Ctrl+C sends
        code = wait_for_exit(term)
    finally:
        term.close()
    output = bytes(term.output)
    assert code != 0
    assert output.index(LEAVE_ALTERNATE) < output.index(b"KeyboardInterrupt")
    assert_restored(output)


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
