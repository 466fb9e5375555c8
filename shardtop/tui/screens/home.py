"""``HomeScreen``: the monitor — GPUs, the processes on them, runs and presets.

``HomeScreen`` only reads; ``ControlledHomeScreen`` adds launching a preset
and stopping a run.  With ``--read-only`` the app uses the first, so those
bindings do not exist at all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from textual import on, work
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal
from textual.geometry import Size
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, OptionList
from textual.worker import get_current_worker

from shardtop.config import ConfigError, Preset, list_presets
from shardtop.gpus import GpuSource, HostProbe, gpu_count
from shardtop.rundir.run_directory import RunDirectory, RunError
from shardtop.tui.screens.attached import while_attached
from shardtop.tui.watch.gpu_feed import GpuFeed, GpuSnapshot
from shardtop.tui.watch.run_catalog import RunCatalog, RunsSnapshot
from shardtop.tui.widgets.gpu_panel import GpuPanel
from shardtop.tui.widgets.host_panel import HostPanel
from shardtop.tui.widgets.keys_footer import KeysFooter
from shardtop.tui.widgets.preset_list import PresetList
from shardtop.tui.widgets.process_table import ProcessTable
from shardtop.tui.widgets.run_list import RunList

if TYPE_CHECKING:  # what only launching and stopping need is imported when first used
    from shardtop.tui.screens.launch_prompt import FitSearchRequest, LaunchRequest, RehearsalRequest

NARROW_WIDTH = 100
SHORT_HEIGHT = 32
"""Below this many lines the process table and the run list give up lines to the GPUs (8 GPUs at 80×24)."""
RUNS_EVERY = 2.0
"""Seconds between looks at the runs directory (GPUs follow the refresh setting)."""
GPUS_FIRST = 2.0
"""Seconds the first look at the runs directory waits, at most, for the GPUs to be on screen.

Summarising a long runs directory takes seconds; started at once, it would hold
the GPUs' first frame back.  It waits until they are shown, or this long where
NVML is slow to answer.
"""


class HomeScreen(Screen[None]):
    """What is on this machine's GPUs, and which runs there are."""

    BINDINGS = [
        Binding("g", "focus_panel('processes')", "Processes", show=False),
        Binding("u", "focus_panel('runs')", "Runs", show=False),
        Binding("p", "focus_panel('presets')", "Presets"),
    ]

    class GpusSampled(Message):
        def __init__(self, snapshot: GpuSnapshot) -> None:
            super().__init__()
            self.snapshot = snapshot

    class RunsListed(Message):
        def __init__(self, snapshot: RunsSnapshot) -> None:
            super().__init__()
            self.snapshot = snapshot

    class PresetsListed(Message):
        def __init__(self, presets: tuple[Preset, ...]) -> None:
            super().__init__()
            self.presets = presets

    def __init__(
        self,
        runs_root: Path,
        refresh: float = 1.0,
        read_only: bool = True,
        gpu_source: GpuSource | None = None,
        host_probe: HostProbe | None = None,
    ) -> None:
        super().__init__()
        self.runs_root = runs_root
        self.refresh_s = refresh
        self.read_only = read_only
        self.gpu_source = gpu_source
        self.host_probe = host_probe
        self.gpus: GpuSnapshot | None = None
        self.runs: RunsSnapshot | None = None
        self.presets: tuple[Preset, ...] = ()
        self._awake = threading.Event()
        self._awake.set()
        self._feeds_done = threading.Event()
        self._poke = threading.Event()
        self._gpus_shown = threading.Event()
        self._was_suspended = False

    def compose(self) -> ComposeResult:
        self._fit(self.app.size, update=False)
        yield GpuPanel(id="gpus")
        yield HostPanel(id="host")
        yield ProcessTable(id="processes")
        with Horizontal(id="lists"):
            yield RunList(id="runs")
            yield PresetList(read_only=self.read_only, id="presets")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.query_one(RunList).focus()
        self.sample_gpus()
        self.watch_runs()

    def on_unmount(self) -> None:
        self._feeds_done.set()
        self._awake.set()
        self._poke.set()

    def on_screen_suspend(self) -> None:
        self._awake.clear()
        self._was_suspended = True

    def on_screen_resume(self) -> None:
        self._awake.set()
        if self._was_suspended:  # back from a run view: show now what changed meanwhile
            self._poke.set()

    def on_resize(self, event: object) -> None:
        self._fit(self.size)

    def _fit(self, size: Size, update: bool = True) -> None:
        """The layout of a narrow or short terminal; ``update=False`` before anything is styled (cheaper)."""
        self.set_class(size.width < NARROW_WIDTH, "-narrow", update=update)
        self.set_class(size.height < SHORT_HEIGHT, "-short", update=update)

    def action_focus_panel(self, widget_id: str) -> None:
        self.query_one(f"#{widget_id}").focus()

    # -- feeds -------------------------------------------------------------------

    def _loop(self, poll: Callable[[], Message | None], every: float) -> None:
        """Poll, post, wait; paused while another screen is on top; polls never overlap."""
        worker = get_current_worker()
        while not worker.is_cancelled and not self._feeds_done.is_set():
            self._awake.wait()
            if worker.is_cancelled or self._feeds_done.is_set():
                return
            message = poll()
            if message is not None:
                self.post_message(message)
            self._poke.wait(every)
            self._poke.clear()

    @work(thread=True, exclusive=True, exit_on_error=False, group="gpu-feed", name="GPU sampler")
    def sample_gpus(self) -> None:
        feed = GpuFeed(source=self.gpu_source, host=self.host_probe)

        def poll() -> Message | None:
            snapshot = feed.poll()
            return None if snapshot is None else self.GpusSampled(snapshot)

        try:
            self._loop(poll, self.refresh_s)
        finally:
            self._gpus_shown.set()  # a failed feed never holds the runs back

    @work(thread=True, exclusive=True, exit_on_error=False, group="runs-feed", name="runs watcher")
    def watch_runs(self) -> None:
        """The presets at once (a few small files), the runs once the GPUs are on screen."""
        self.post_message(self.PresetsListed(tuple(list_presets())))
        self._gpus_shown.wait(GPUS_FIRST)
        catalog = RunCatalog(self.runs_root, here=self.host_probe.name if self.host_probe is not None else None)

        def poll() -> Message | None:
            snapshot = catalog.poll()
            return None if snapshot is None else self.RunsListed(snapshot)

        self._loop(poll, max(self.refresh_s, RUNS_EVERY))

    @while_attached
    def on_home_screen_gpus_sampled(self, message: GpusSampled) -> None:
        self.gpus = message.snapshot
        self._show()
        if not self._gpus_shown.is_set():
            self.call_after_refresh(self._gpus_shown.set)

    @while_attached
    def on_home_screen_presets_listed(self, message: PresetsListed) -> None:
        self.presets = message.presets
        self.query_one(PresetList).show(message.presets)

    @while_attached
    def on_home_screen_runs_listed(self, message: RunsListed) -> None:
        self.runs = message.snapshot
        with self.app.batch_update():
            self.query_one(RunList).show(message.snapshot.rows)
            self._show()

    def _show(self) -> None:
        gpus, runs = self.gpus, self.runs
        owners = runs.owners if runs is not None else {}
        with self.app.batch_update():
            if gpus is not None:
                self.query_one(GpuPanel).show(gpus, owners, runs.host_gpus if runs is not None else ())
                self.query_one(ProcessTable).show(gpus.processes, owners)
                self.query_one(ProcessTable).display = bool(gpus.gpus)
            self.query_one(HostPanel).show(
                host=gpus.host if gpus is not None else None,
                show_ranks=not gpus.gpus if gpus is not None else None,
                ranks=runs.live_ranks if runs is not None else None,
            )

    # -- opening runs ------------------------------------------------------------

    @on(DataTable.RowSelected, "#runs")
    def _run_chosen(self, event: DataTable.RowSelected) -> None:
        row = self.query_one(RunList).selected()
        if row is not None:
            self.app.open_run(RunDirectory(row.path))  # type: ignore[attr-defined]

    @on(OptionList.OptionSelected, "#presets")
    def _preset_chosen(self, event: OptionList.OptionSelected) -> None:
        self.choose_preset(str(event.option.id))

    def choose_preset(self, name: str) -> None:
        """Enter on a preset; read-only, it only says why nothing happens."""
        self.notify("Read-only: launching is off. Start shardtop without --read-only to launch.")

    def commands(self) -> Iterable[SystemCommand]:
        yield SystemCommand("Runs", "Go to the list of runs", lambda: self.action_focus_panel("runs"))
        yield SystemCommand("Presets", "Go to the list of presets", lambda: self.action_focus_panel("presets"))


class ControlledHomeScreen(HomeScreen):
    """The monitor with its two actions: launch a preset, stop a run."""

    BINDINGS = [
        Binding("l", "launch", "Launch", tooltip="Launch the highlighted preset"),
        Binding("k", "stop", "Stop run", tooltip="Stop the selected run (asks first)"),
    ]

    def choose_preset(self, name: str) -> None:
        self.action_launch(name)

    def action_launch(self, name: str | None = None) -> None:
        from shardtop.tui.screens.launch_prompt import LaunchPrompt

        name = name or self.query_one(PresetList).selected
        presets = {p.name: p for p in self.presets}
        if name is None or name not in presets:
            self.notify("Choose a preset first (p moves to the list).")
            return
        gpus = self.gpus.gpus if self.gpus is not None else ()
        self.app.push_screen(LaunchPrompt(presets[name], gpu_count, gpus), self._launch)

    def _launch(self, request: LaunchRequest | RehearsalRequest | FitSearchRequest | None) -> None:
        from shardtop.tui.screens.launch_prompt import FitSearchRequest, RehearsalRequest

        if request is None:
            return
        if isinstance(request, FitSearchRequest):
            self._find_what_fits(request)
            return
        try:
            if isinstance(request, RehearsalRequest):
                run = rehearse_run(self.runs_root, request)
            else:
                run = launch_run(self.runs_root, request)
        except (ConfigError, RunError, OSError) as e:
            self.notify(f"Nothing launched: {e}", severity="error", timeout=10)
            return
        self._poke.set()
        self.app.open_run(run)  # type: ignore[attr-defined]

    def _find_what_fits(self, request: FitSearchRequest) -> None:
        """Start ``shardtop fit`` detached; its rehearsals come into the run list as they start."""
        from shardtop.fit.detached import PROGRESS_LOG, TABLE_FILE, start_detached

        try:
            directory = start_detached(self.runs_root, request.settings)
        except (RunError, OSError) as e:
            self.notify(f"Nothing started: {e}", severity="error", timeout=10)
            return
        self._poke.set()
        self.notify(f"Finding what fits: {request.command}. Each rehearsal comes into Runs as it starts; progress "
                    f"in {directory / PROGRESS_LOG}, the table in {directory / TABLE_FILE}.", timeout=15)

    def action_stop(self) -> None:
        row = self.query_one(RunList).selected()
        if row is None or not row.live:
            self.notify("Select a running run first.")
            return
        from shardtop.tui.screens.confirm import ConfirmScreen

        run = RunDirectory(row.path)
        self.app.push_screen(
            ConfirmScreen(f"Stop run {run.id}?", "Its processes get SIGTERM, then SIGKILL after 10 s."),
            lambda yes: self._stop_confirmed(run, yes),
        )

    def _stop_confirmed(self, run: RunDirectory, yes: bool | None) -> None:
        if yes:
            self.stop_run(run)

    @work(thread=True, exclusive=False, exit_on_error=False, group="stop", name="stop run")
    def stop_run(self, run: RunDirectory) -> None:
        from shardtop.launch import stop

        stopped = stop(run, grace=10.0, out=lambda _line: None)
        self.app.call_from_thread(self.notify, f"Stopped {run.id}." if stopped else f"{run.id} was not running.")
        self._poke.set()

    def commands(self) -> Iterable[SystemCommand]:
        yield from super().commands()
        for preset in self.presets:
            yield SystemCommand(
                f"Launch {preset.name}", preset.description, lambda p=preset: self.action_launch(p.name)
            )


def launch_run(runs_root: Path, request: LaunchRequest) -> RunDirectory:
    """Create the run directory and start the run, as ``shardtop launch`` does (no child is left here)."""
    from shardtop.launch import create_run, start
    from shardtop.rundir.run_config import RunConfig

    run = create_run(runs_root, RunConfig.of(request.config), ["shardtop", "launch", *request.settings])
    start(run)
    return run


def rehearse_run(runs_root: Path, request: RehearsalRequest) -> RunDirectory:
    """Start the rehearsal of the settings, as ``shardtop rehearse`` does (no child is left here)."""
    from shardtop.rehearse.spec import parse_settings
    from shardtop.rehearse.start import start_one

    spec, rest = parse_settings(request.settings)
    started = start_one(spec, spec.worlds[0], rest, None, runs_dir=str(runs_root), name=None)
    return started.run
