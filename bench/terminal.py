"""A command in a pseudo-terminal, as a user's terminal would run it: what it writes, when, and its CPU.

Shared by the benchmarks in this folder.  A thread drains the pty master (as a
terminal emulator or sshd does), counting every byte and keeping the text with
the escape sequences taken out, so "is the screen there yet?" can be asked of
what a user would read.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Mapping

import psutil

ESCAPES = re.compile(rb"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][0-9A-Za-z]|[=>78DEHMNOPZc])")
"""CSI, OSC and the short escape sequences: what a terminal draws nothing for."""
KEEP = 4_000_000
"""Bytes of screen text kept for ``wait_for`` (the counting goes on past it)."""


def _with_ctrl_c(args: list[str]) -> list[str]:
    """``args``, started with Ctrl+C and Ctrl+\\ doing what they do in a user's terminal.

    A program started in the background of a script (``pytest &``) inherits SIGINT and SIGQUIT
    ignored, and Python then never turns SIGINT into ``KeyboardInterrupt``; a login shell's
    terminal gives them their default action again, and so does ``env --default-signal``.
    """
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return args
    return ["env", "--default-signal=INT,QUIT", *args]


def _without_size(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less ``COLUMNS`` and ``LINES``: programs take them over the terminal's own size (pytest-xdist's
    processes set them to 80 and 24)."""
    return {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}


class Terminal:
    """``args`` running in a ``size`` (columns, lines) pseudo-terminal until ``close``, in ``cwd`` if given.

    ``keys=False``: stdin is ``/dev/null``, as for a program run from a script; it draws on the
    terminal but reads no key from it.
    """

    def __init__(
        self, args: list[str], size: tuple[int, int] = (160, 48), env: dict[str, str] | None = None,
        cwd: str | None = None, keys: bool = True,
    ) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            _with_ctrl_c(args),
            stdin=slave if keys else subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
            close_fds=True,
            env={**_without_size(os.environ), "TERM": "xterm-256color", **(env or {})},
            start_new_session=True,
            cwd=cwd,
        )
        os.close(slave)
        self.master = master
        self.output = bytearray()
        """The raw bytes written, up to ``KEEP``."""
        self.text = bytearray()
        """What was written with the escape sequences taken out, up to ``KEEP``."""
        self.written = 0
        self.reads: list[tuple[float, int]] = []
        """(seconds since the start, bytes) for each read of the pty, while ``output`` is kept."""
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        pending = b""
        while True:
            try:
                ready, _, _ = select.select([self.master], [], [], 0.2)
                if not ready:
                    if self.proc.poll() is not None:
                        return
                    continue
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self._lock:
                self.written += len(chunk)
                if len(self.output) < KEEP:
                    self.output += chunk
                    self.reads.append((time.perf_counter() - self.started, len(chunk)))
                    # an escape sequence cut between two reads is stripped once it is whole
                    data = pending + chunk
                    cut = data.rfind(b"\x1b")
                    if cut >= 0 and len(data) - cut < 64:
                        data, pending = data[:cut], data[cut:]
                    else:
                        pending = b""
                    self.text += ESCAPES.sub(b"", data)

    def wait_for(self, *needles: bytes, timeout: float = 30.0) -> float:
        """Seconds from the start until every needle is in the screen text."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            with self._lock:
                if all(n in self.text for n in needles):
                    return time.perf_counter() - self.started
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.proc.args[0]} exited with {self.proc.returncode}: {self.screen_text()[-400:]}"
                )
            time.sleep(0.005)
        raise TimeoutError(f"{needles} not on screen after {timeout}s: {self.screen_text()[-400:]}")

    def screen_text(self) -> str:
        with self._lock:
            return self.text.decode(errors="replace")

    def window(self, start: int, end: int) -> tuple[bytes, list[tuple[float, int]]]:
        """The bytes written from offset ``start`` to ``end``, and the reads of the pty that brought them."""
        with self._lock:
            data = bytes(self.output[start:end])
            reads, offset = [], 0
            for stamp, size in self.reads:
                if start <= offset < end:
                    reads.append((stamp, size))
                offset += size
        return data, reads

    def cpu_seconds(self) -> float:
        """User + system seconds of the command and its children so far."""
        proc = psutil.Process(self.proc.pid)
        total = sum(proc.cpu_times()[:2])
        for child in proc.children(recursive=True):
            try:
                total += sum(child.cpu_times()[:2])
            except psutil.Error:
                pass
        return total

    def measure(self, seconds: float) -> tuple[float, float]:
        """(% of one core, bytes per second written to the terminal) over the next ``seconds``."""
        c0, b0, t0 = self.cpu_seconds(), self.written, time.perf_counter()
        time.sleep(seconds)
        c1, b1, t1 = self.cpu_seconds(), self.written, time.perf_counter()
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.proc.args[0]} exited early with {self.proc.returncode}")
        return 100.0 * (c1 - c0) / (t1 - t0), (b1 - b0) / (t1 - t0)

    def close(self, quit_key: bytes = b"q") -> None:
        """Press ``quit_key``; end the process group if it does not leave within 5 s."""
        try:
            os.write(self.master, quit_key)
            self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            self.proc.wait()
        os.close(self.master)
