"""The top of the home screen (or, for ``attach``, of a run's view) drawn as plain text at once, while
Textual loads.

Textual needs a few hundred milliseconds to import and lay out its first
screen, more on a busy machine; nvitop draws its first screen in under 0.2 s.
So on a terminal, ``shardtop`` first writes what the home screen will show at
its top (the GPUs with their memory, the processes on them, the preset names)
to the alternate screen, with the same figures and words as the home screen
(``format.py``, ``gpus.py``), then loads Textual, which takes the screen over.
``shardtop attach`` draws the run view's top the same way (``run_frame.py``).

Textual's own driver would clear the alternate screen as it starts, leaving it
blank until its first paint; the driver ``painted`` gives Textual leaves the
frame up instead, until that paint covers it.

The terminal is left as it was on every path.  Until Textual's driver has
taken the terminal over, leaving ``painted`` (Textual failing to import or to
start, Ctrl+C) leaves the alternate screen, shows the cursor and wraps lines
again; from then on Textual restores the terminal itself.  Nothing is written
without a terminal, or with nothing to show (no GPU for the home screen).  This module imports Textual only
once the frame is up, to hand it over.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TextIO

from shardtop.tui.format import (
    PROCESS_COLUMNS,
    bar,
    fraction,
    gpu_line_parts,
    process_cells,
    truncate,
)
from shardtop.words import aligned

if TYPE_CHECKING:
    from textual.driver import Driver

    from shardtop.gpus import GpuProcessInfo
    from shardtop.rundir.memory_figures import GpuMemory

Frame = Callable[[int, int], list[str]]
"""A frame's lines for a terminal of (columns, lines)."""

ALTERNATE_SCREEN = "\x1b[?1049h"
"""To the alternate screen (the main screen's cursor is saved); most terminals clear it as they switch."""
ENTER = ALTERNATE_SCREEN + "\x1b[?25l\x1b[?7l\x1b[H\x1b[2J"
"""To the alternate screen, cleared; cursor hidden; no line wrap (a long line is cut, never scrolls)."""
LEAVE = "\x1b[?1049l\x1b[?25h\x1b[?7h"
"""Back to the main screen as it was; cursor shown; lines wrap again."""
WIDE = 100
"""From this many columns a GPU line shows temperature and power, as the home screen's does."""
CONTROLS = dict.fromkeys((*range(0x20), *range(0x7F, 0xA0)), " ")
"""Control characters (a command line's newlines, a process's own escape codes) are drawn as spaces."""


@dataclass(frozen=True)
class FirstLook:
    """What the first frame shows: one NVML sample, the processes on the GPUs, the preset names."""

    gpus: tuple[GpuMemory, ...]
    processes: tuple[GpuProcessInfo, ...]
    presets: tuple[str, ...]


def look() -> FirstLook | None:
    """One look at NVML, psutil and the presets; None where there is no GPU to show.

    The CPU figures are left out: psutil's first reading of a process is always 0.
    """
    from shardtop.config import preset_names
    from shardtop.gpus import GpuUnavailable, HostProbe, Nvml

    try:
        nvml = Nvml()
    except GpuUnavailable:
        return None
    gpus = nvml.sample()
    if not gpus:
        return None
    processes = HostProbe().describe(nvml.process_uses())
    return FirstLook(
        gpus=tuple(gpus),
        processes=tuple(replace(p, cpu_percent=None) for p in processes),
        presets=tuple(preset_names()),
    )


def gpu_line(gpu: GpuMemory, width: int) -> str:
    """A GPU's line as the home screen draws it, without colour, history or owners."""
    parts = gpu_line_parts(gpu, width)
    wide = width >= WIDE
    head = f"{parts['index']} {parts['name']} "
    tail = f" {parts['memory']}  {parts['util']}" + (f"  {parts['temperature']}  {parts['power']}" if wide else "")
    filled, empty = bar(fraction(gpu.used, gpu.total), max(8, min(48, width - len(head) - len(tail) - 4)))
    return f" {head}{filled}{empty}{tail}"


def process_lines(processes: tuple[GpuProcessInfo, ...]) -> list[str]:
    """The process table as aligned text: a header, then one row per process.

    A column empty in every row (which run a process is: not known yet) is left out.
    """
    rows = [process_cells(p, {}) for p in processes]
    shown = [i for i in range(len(PROCESS_COLUMNS)) if any(row[i] for row in rows)]
    table = [[PROCESS_COLUMNS[i] for i in shown], *([row[i] for i in shown] for row in rows)]
    return [" " + line for line in aligned(table)]


def word_lines(words: tuple[str, ...], width: int) -> list[str]:
    """``words`` two spaces apart, as many to a line as fit in ``width``."""
    lines: list[str] = []
    for word in words:
        if lines and len(lines[-1]) + 2 + len(word) <= width:
            lines[-1] += "  " + word
        else:
            lines.append(" " + word)
    return lines


def frame_lines(first: FirstLook, width: int, height: int) -> list[str]:
    """The frame, at most ``height`` lines of at most ``width`` cells; the processes give up lines first."""
    top = ["shardtop · starting", f"GPUs ({len(first.gpus)})", *(gpu_line(g, width) for g in first.gpus)]
    count = len(first.processes)
    processes = [f"Processes on the GPUs ({count})", *process_lines(first.processes)] if count else []
    presets = ["Presets", *word_lines(first.presets, width)]
    room = max(0, height - len(top) - len(presets))
    if len(processes) > room:
        processes = processes[: max(0, room - 1)] + ([f" … {count} in all"] if room else [])
    return [truncate(line.translate(CONTROLS), width) for line in (top + processes + presets)[:height]]


class FirstFrame:
    """The frame on one terminal, and whose the terminal is: ours until ``hand_over``, Textual's after."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.shown = False
        """The frame is on the alternate screen and leaving it is ours to do."""
        self._suspend: Any = None

    def show(self, lines: Frame) -> None:
        """Draw ``lines`` at the terminal's size; Ctrl+Z is ignored meanwhile, so that no shell ever gets the
        alternate screen."""
        try:
            self._suspend = signal.signal(signal.SIGTSTP, signal.SIG_IGN)
        except ValueError:  # not the main thread: signals are not ours to set
            self._suspend = None
        self.shown = True
        _write(self.out, ENTER + _positioned(lines(*_size(self.out))))

    def hand_over(self) -> None:
        """Textual has taken the terminal over: restoring it is now Textual's to do."""
        self.shown = False
        if self._suspend is not None:
            signal.signal(signal.SIGTSTP, self._suspend)
            self._suspend = None

    def close(self) -> None:
        """Leave the alternate screen unless Textual took it over."""
        if self.shown:
            _write(self.out, LEAVE)
        self.hand_over()

    def driver(self) -> type[Driver]:
        """Textual's own Linux driver, taking the terminal over from this frame.

        Its switch to the alternate screen, which would clear the frame, is left
        out (the frame is on it already); Textual's first paint then covers the
        frame whole.  A later switch (back from Ctrl+Z) is made as usual.
        """
        from textual.drivers.linux_driver import LinuxDriver

        frame = self

        class TakesOverTheFrame(LinuxDriver):
            def write(self, data: str) -> None:
                if data == ALTERNATE_SCREEN and frame.shown:
                    return
                super().write(data)

            def start_application_mode(self) -> None:
                LinuxDriver.start_application_mode(self)
                frame.hand_over()

        return TakesOverTheFrame


def home_frame() -> Frame | None:
    """The home screen's top from one look at the GPUs; None where there is no GPU to show."""
    first = look()
    return None if first is None else (lambda width, height: frame_lines(first, width, height))


@contextmanager
def painted(stream: TextIO | None = None, frame_of: Callable[[], Frame | None] | None = None
            ) -> Iterator[type[Driver] | None]:
    """Show a first frame on ``stream`` (stdout) if it is a terminal; yield the driver for Textual.

    ``frame_of`` reads what the frame shows (None: the home screen's, ``home_frame``)
    and may find nothing to show.  The driver (None where no frame was shown:
    Textual's own is right) takes the screen over from the frame.  Whatever ends
    the block before it has, the terminal is restored.
    """
    frame = FirstFrame(sys.stdout if stream is None else stream)
    if os.name == "posix" and frame.out.isatty():
        try:
            lines = (frame_of or home_frame)()
        except Exception:  # noqa: BLE001 - the frame is a courtesy: the screen itself says what failed, in words
            lines = None
        if lines is not None:
            frame.show(lines)
    try:
        yield frame.driver() if frame.shown else None
    finally:
        frame.close()


def _size(out: TextIO) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(out.fileno())
    except (OSError, ValueError):
        return 80, 24
    return size.columns, size.lines


def _positioned(lines: list[str]) -> str:
    """Each line at its own row: nothing scrolls, whatever a line holds."""
    return "".join(f"\x1b[{row};1H{line}" for row, line in enumerate(lines, start=1))


def _write(out: TextIO, text: str) -> None:
    try:
        out.write(text.encode(out.encoding or "utf-8", "replace").decode(out.encoding or "utf-8"))
        out.flush()
    except (OSError, ValueError):  # the terminal went away: nothing left to draw on
        pass
