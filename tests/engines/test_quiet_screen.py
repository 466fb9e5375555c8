"""Over SSH every byte counts: an unchanged screen sends nothing, a changed figure sends only itself.

The real app runs in a pseudo-terminal (Textual's own Linux driver writing to
it, as over SSH) on recorded hardware: the H200 at story 2's OOM, its host and
the rank's process, sampled four times a second.  The bytes it writes are counted.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bench.terminal import Terminal
from tests.support.recorded import copy_runs, h200_processes

ROOT = Path(__file__).resolve().parents[2]
PID = next(iter(h200_processes()))

APP = """
import sys
from dataclasses import replace
from pathlib import Path
import msgspec
from shardtop.tui.app import ShardtopApp
from tests.support.recorded import H200_HOST, RecordedHost, h200_processes, nvml_samples

runs, flag, busier = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
before = nvml_samples()[-1]
after = [msgspec.structs.replace(before[0], power_w=before[0].power_w + 7.0)]

class OneChange:
    '''The recorded sample, over and over; seven watts more once ``flag`` exists.'''
    def sample(self):
        return after if flag.exists() else before

class BusierRank(RecordedHost):
    '''The recorded rank at 99 % CPU; at 57 % once ``busier`` exists.'''
    def describe(self, uses):
        return [replace(p, cpu_percent=57.0) if busier.exists() else p for p in super().describe(uses)]

ShardtopApp(runs, refresh=0.25, gpu_source=OneChange(), host_probe=BusierRank(H200_HOST, h200_processes())).run()
"""


def test_an_unchanged_home_screen_sends_nothing_and_a_new_figure_only_itself(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    copy_runs(runs, "h200/zero3-linear")
    flag, busier = tmp_path / "more-power", tmp_path / "busier"
    term = Terminal(
        [sys.executable, "-c", APP, str(runs), str(flag), str(busier)], size=(120, 40), env={"PYTHONPATH": str(ROOT)}
    )
    try:
        term.wait_for(b"H200", b"zero3-linear", b"Presets", timeout=60)
        time.sleep(1.0)  # the first frames settle (the run list arrives, the table sizes its columns)
        quiet_from = term.written
        time.sleep(2.0)  # eight samples, all equal to what is on screen
        quiet = term.written - quiet_from
        changed_from, shown = term.written, len(term.screen_text())
        flag.touch()
        time.sleep(1.0)
        changed = term.written - changed_from
        sent = term.screen_text()[shown:]
        cpu_from, shown = term.written, len(term.screen_text())
        busier.touch()
        time.sleep(1.5)  # the processes are looked at once a second
        cpu_changed = term.written - cpu_from
        cpu_sent = term.screen_text()[shown:]
    finally:
        term.close()
    assert quiet == 0, f"an unchanged screen wrote {quiet} bytes in 2 s"
    assert "130" in sent, "the new power figure (123 W -> 130 W) reached the terminal"
    # the figures' piece (utilisation, temperature, power: they change together on a busy GPU), not the rest
    assert "°C" in sent and not any(w in sent for w in ("H200", "GiB", "pid")), f"only the figures were sent: {sent!r}"
    # the figures and the memory history (it grew meanwhile), with their colours; the line is ~600 bytes
    assert changed < 250, f"a new power figure cost {changed} bytes: {sent!r}"
    # a process's new CPU figure: its own cells, not its row from the table's left edge (pid, user, GPU memory)
    assert "57" in cpu_sent, "the rank's new CPU figure (99 -> 57) reached the terminal"
    row_words = ("root", "python", "16.8G", str(PID))
    assert not any(w in cpu_sent for w in row_words), f"only the figure was sent: {cpu_sent!r}"
    # the figure with its colours (~35 bytes) and the memory history, which grew again meanwhile (~60 bytes)
    assert cpu_changed < 130, f"a new CPU figure cost {cpu_changed} bytes: {cpu_sent!r}"
