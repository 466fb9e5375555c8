"""The plain first frame of the real ``shardtop`` in a pseudo-terminal: before Textual, and the terminal as
it was on every way out.

NVML answers from story 2's two-H200 recording (``bench/recorded_nvml.py``, as
``bench_ssh.py`` runs it); the bytes a terminal would get are read back.  The
frame's lines themselves are checked in tests/tui/test_first_frame.py.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from bench.recorded_nvml import write_samples
from bench.terminal import Terminal
from shardtop.tui.first_frame import ALTERNATE_SCREEN
from tests.support.recorded import copy_runs

ROOT = Path(__file__).resolve().parents[2]
LEAVE_ALTERNATE = b"\x1b[?1049l"
TEXTUAL_STARTED = b"\x1b[?1000h"
"""Textual's driver turns mouse reporting on as it starts; the first frame never does."""


@pytest.fixture
def recorded_nvml(tmp_path: Path) -> Path:
    """Story 2's two H200s replayed through pynvml; this test's own process is the one on both GPUs."""
    return write_samples(tmp_path / "nvml.json", [os.getpid(), os.getpid()])


def shardtop_in_a_terminal(
    samples: Path, runs: Path, *args: str, module: str = "shardtop", extra: Path | None = None, keys: bool = True
) -> Terminal:
    path = os.pathsep.join(str(p) for p in (ROOT, extra) if p is not None)
    argv = [
        sys.executable, str(ROOT / "bench" / "recorded_nvml.py"), str(samples), "-m", module, "--runs-dir", str(runs),
        *args,
    ]
    return Terminal(argv, size=(120, 40), env={"PYTHONPATH": path, "SHARDTOP_REFRESH": "1"}, keys=keys)


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


def test_without_keys_attach_follows_in_lines_and_the_monitor_says_why_it_cannot_open(
    tmp_path: Path, recorded_nvml: Path
) -> None:
    """stdout a terminal, stdin ``/dev/null`` (a script, ``< /dev/null``): no full-screen view, whose key
    reader would spin a core on the empty input with no key to quit it."""
    runs = tmp_path / "runs"
    run = copy_runs(runs, "h200x2/zero3-linear")["h200x2/zero3-linear"]
    attach = shardtop_in_a_terminal(recorded_nvml, runs, "attach", run.name, keys=False)
    try:
        code = wait_for_exit(attach, timeout=60)
    finally:
        attach.close()
    assert code == 1, attach.screen_text()[-2000:]  # the run's own exit code, as --headless gives it
    assert TEXTUAL_STARTED not in attach.output and ALTERNATE_SCREEN.encode() not in attach.output
    assert b"Rank 0 ran out of memory on cuda:0 during setup in model.net.15330" in attach.output
    monitor = shardtop_in_a_terminal(recorded_nvml, runs, keys=False)
    try:
        code = wait_for_exit(monitor, timeout=60)
    finally:
        monitor.close()
    assert code == 2
    assert b"the monitor needs a terminal to draw on and read keys from" in monitor.output
    assert ALTERNATE_SCREEN.encode() not in monitor.output, "no frame drawn before the refusal"

