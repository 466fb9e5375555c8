"""``ShardtopApp`` and ``run_app``: the entry point ``shardtop``, ``launch`` and ``attach`` open.

The app holds no data of its own: the home screen watches the GPUs and the
runs directory, a run screen watches one run.  ``read_only`` picks the screen
classes without any action that changes something, so those bindings are
absent rather than disabled.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.worker import Worker, WorkerState

if TYPE_CHECKING:
    from textual.driver import Driver

    from shardtop.gpus import GpuSource, HostProbe
    from shardtop.read.follower import RunFollower
    from shardtop.rundir.run_directory import RunDirectory
    from shardtop.tui.screens.home import HomeScreen
    from shardtop.tui.screens.run_view import RunScreen


class ShardtopApp(App[int]):
    """nvtop for sharded training."""

    CSS_PATH = Path(__file__).parent / "shardtop.tcss"
    TITLE = "shardtop"
    BINDINGS = [
        Binding("q", "quit", "Quit", tooltip="Quit shardtop; the runs go on"),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(
        self,
        runs_root: Path,
        run: str | None = None,
        read_only: bool = False,
        refresh: float = 1.0,
        gpu_source: GpuSource | None = None,
        host_probe: HostProbe | None = None,
        clock: Callable[[], float] = time.time,
        driver_class: type[Driver] | None = None,
        follower: RunFollower | None = None,
    ) -> None:
        """``run``: a run id or directory to open at once (None: the home screen).

        ``refresh``: seconds between screen updates; ``gpu_source`` and
        ``host_probe`` replace NVML and psutil (recorded samples in tests);
        ``clock`` gives "now" for elapsed times (frozen in snapshot tests);
        ``driver_class``: Textual's terminal driver (None: its own), or the one
        that takes the screen over from the plain first frame; ``follower``: the
        run's follower, where that frame has read the head of its events.
        """
        super().__init__(driver_class=driver_class)
        if ANIMATIONS_ENV not in os.environ:
            self.animation_level = "none"
        self.runs_root = Path(runs_root)
        self.initial_run = run
        self.read_only = read_only
        self.refresh_s = refresh
        self.gpu_source = gpu_source
        self.host_probe = host_probe
        self.clock = clock
        self._first_home: HomeScreen | None = None
        self._follower = follower
        if read_only:
            self.sub_title = "read-only"

    def on_load(self) -> None:
        """Before Textual takes the terminal: the home screen's code is loaded while the plain first frame is up."""
        self._first_home = self._home() if self.initial_run is None else None

    def on_mount(self) -> None:
        if self.initial_run is None:
            self.push_screen(self._first_home if self._first_home is not None else self._home())
            return
        from shardtop.rundir.run_directory import RunError, find_run

        try:
            run = find_run(self.runs_root, self.initial_run)
        except RunError as e:
            self.push_screen(self._home())
            self.notify(str(e), severity="error", timeout=10)
            return
        self.push_screen(self._run_screen(run))

    # Screens are imported when first shown: `attach` never pays for the home screen, nor `shardtop` for a run.

    def _home(self) -> HomeScreen:
        from shardtop.tui.screens.home import ControlledHomeScreen, HomeScreen

        cls = HomeScreen if self.read_only else ControlledHomeScreen
        return cls(
            self.runs_root,
            refresh=self.refresh_s,
            read_only=self.read_only,
            gpu_source=self.gpu_source,
            host_probe=self.host_probe,
        )

    def _run_screen(self, run: RunDirectory) -> RunScreen:
        from shardtop.tui.screens.run_view import ControlledRunScreen, RunScreen

        cls = RunScreen if self.read_only else ControlledRunScreen
        follower, self._follower = self._follower, None
        if follower is not None and follower.run.path != run.path:
            follower = None
        return cls(run, refresh=self.refresh_s, read_only=self.read_only, clock=self.clock, follower=follower)

    def open_run(self, run: RunDirectory) -> None:
        """Open a run's view on top of the home screen."""
        self.push_screen(self._run_screen(run))

    def action_home(self) -> None:
        """Back to the home screen: pop to it, or start it where the app opened on a run."""
        from shardtop.tui.screens.home import HomeScreen

        homes = [s for s in self.screen_stack if isinstance(s, HomeScreen)]
        if homes:
            while self.screen is not homes[-1]:
                self.pop_screen()
        else:
            self.switch_screen(self._home())

    def action_help(self) -> None:
        from shardtop.tui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Help", "Keys and symbols", self.action_help)
        commands = getattr(screen, "commands", None)
        if commands is not None:
            yield from commands()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Every worker failure ends up here: said once, in words, without a traceback."""
        if event.state == WorkerState.ERROR:
            error = event.worker.error
            self.notify(f"{event.worker.name} failed: {type(error).__name__}: {error}", severity="error", timeout=15)


ANIMATIONS_ENV = "TEXTUAL_ANIMATIONS"
"""Unset, shardtop draws no animation: a tab's sliding underline sends 4 KiB over SSH in 0.3 s.
``TEXTUAL_ANIMATIONS=full`` (or ``basic``) brings Textual's animations back."""

REFRESH_ENV = "SHARDTOP_REFRESH"
"""Seconds between screen updates (default 1; 0.1 for a busy eye, 5 for a slow link)."""


def refresh_setting(environ: Mapping[str, str] = os.environ) -> float:
    """``$SHARDTOP_REFRESH``, within 0.05…60 s; 1 s when unset or unreadable."""
    try:
        value = float(environ.get(REFRESH_ENV, "1"))
    except ValueError:
        return 1.0
    return min(60.0, max(0.05, value))


def run_app(
    runs_root: Path,
    run: str | None = None,
    read_only: bool = False,
    refresh: float | None = None,
    driver_class: type[Driver] | None = None,
    follower: RunFollower | None = None,
) -> int:
    """Open the TUI; returns the exit code (0: the user quit).

    ``refresh``: seconds between screen updates (``--interval``); None reads ``$SHARDTOP_REFRESH``;
    ``driver_class``: Textual's terminal driver (None: its own); ``follower``: ``run``'s, read on from
    where the first frame left it.
    """
    refresh = refresh_setting() if refresh is None else refresh
    app = ShardtopApp(
        runs_root=runs_root, run=run, read_only=read_only, refresh=refresh, driver_class=driver_class,
        follower=follower,
    )
    result = app.run()
    return int(result or app.return_code or 0)
