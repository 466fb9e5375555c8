"""``RunScreen``: one run — header, memory per rank, the shard tree, details, OOM, findings, logs.

``RunScreen`` only reads; ``ControlledRunScreen`` adds stopping the run.  With
``--read-only`` the app uses the first, so the stop binding does not exist at
all (not merely disabled).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.geometry import Size
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Input, TabbedContent, TabPane
from textual.worker import get_current_worker

from shardtop.diagnose import diagnose
from shardtop.read.follower import RunFollower
from shardtop.read.oom_story import under_zero_init
from shardtop.read.shard_model import Node
from shardtop.rundir.run_directory import RunDirectory
from shardtop.tui.screens.attached import while_attached
from shardtop.tui.screens.confirm import ConfirmScreen
from shardtop.tui.screens.report_view import ReportScreen, render_markdown, save_report
from shardtop.tui.watch.run_feed import Diagnosis, RunFeed, RunSnapshot
from shardtop.tui.widgets.findings_list import FindingsList
from shardtop.tui.widgets.keys_footer import KeysFooter
from shardtop.tui.widgets.log_pane import LogPane
from shardtop.tui.widgets.module_details import ModuleDetails
from shardtop.tui.widgets.oom_panel import OomPanel, no_module_words
from shardtop.tui.widgets.plan_check import PlanVsRun
from shardtop.tui.widgets.rank_memory import RankMemory
from shardtop.tui.widgets.run_header import RunHeader
from shardtop.tui.widgets.search_bar import SearchBar
from shardtop.tui.widgets.shard_tree import ShardTree

NARROW_WIDTH = 120
"""Below this many columns the side panel goes under the tree."""
STOP_GRACE = 10.0


def empty_tree_words(snap: RunSnapshot) -> str:
    """What the tree says while there is none: waiting, or why there never will be."""
    story = snap.model.first_oom
    oom = story.oom if story is not None else None
    if oom is not None and under_zero_init(oom):
        return (
            f"No module tree: rank {oom.rank} ran out of memory while deepspeed.zero.Init was building the model. "
            "The OOM tab says what was being built."
        )
    if oom is not None:
        return f"No module tree: rank {oom.rank} ran out of memory before the model was read. See the OOM tab."
    if not snap.live:
        return (
            "No module tree: the run ended before the probe read the model (it reads it before the engine "
            "set-up if the model exists then, and once the engine has wrapped it)."
        )
    waiting = "No module tree yet: the ranks send it once the engine has wrapped the model."
    if not snap.activity:
        return waiting
    return "\n".join([waiting, "", "Meanwhile:", *(a.words for a in snap.activity)])


def oom_module(snap: RunSnapshot) -> str | None:
    """The module the first OOM names (None when it named none)."""
    story = snap.model.first_oom
    return story.module if story is not None else None


class RunScreen(Screen[None]):
    """Watch one run: nothing here changes the run."""

    BINDINGS = [
        Binding("slash", "search", "Find", tooltip="Find modules by path"),
        Binding("o", "jump_oom", "OOM", tooltip="Go to the module where a rank ran out of memory"),
        Binding("r", "report", "Report"),
        Binding("m", "tab('module')", "Module", show=False),
        Binding("f", "tab('findings')", "Findings", show=False),
        Binding("l", "tab('log')", "Log", show=False),
        Binding("p", "tab('plan')", "Plan", show=False),
        Binding("escape", "home", "Home"),
    ]

    class Updated(Message):
        """The run feed has a new snapshot."""

        def __init__(self, snapshot: RunSnapshot) -> None:
            super().__init__()
            self.snapshot = snapshot

    class ReportReady(Message):
        def __init__(self, markdown: str, saved: Path | None) -> None:
            super().__init__()
            self.markdown = markdown
            self.saved = saved

    def __init__(
        self,
        run: RunDirectory,
        refresh: float = 1.0,
        read_only: bool = True,
        clock: Callable[[], float] = time.time,
        findings: Diagnosis = diagnose,
        follower: RunFollower | None = None,
    ) -> None:
        """``follower``: the run's, where ``attach``'s first frame has begun reading it."""
        super().__init__()
        self.run_dir = run
        self._follower = follower
        self.refresh_s = refresh
        self.read_only = read_only
        self.clock = clock
        self.findings_of = findings
        self.snapshot: RunSnapshot | None = None
        self._wake = threading.Event()
        self._feeds_done = threading.Event()
        self._oom_seen = False

    def compose(self) -> ComposeResult:
        self._fit(self.app.size, update=False)
        yield RunHeader(clock=self.clock, id="header")
        with Horizontal(id="body"):
            with Vertical(id="tree-column"):
                yield ShardTree(id="tree")
                yield SearchBar(id="search")
            with Vertical(id="side"):
                yield RankMemory(id="ranks")
                with TabbedContent(id="tabs", initial="module"):
                    with TabPane("Module", id="module"):
                        yield ModuleDetails(id="details")
                    with TabPane("OOM", id="oom"):
                        yield OomPanel(id="oom-panel")
                    with TabPane("Findings", id="findings"):
                        yield FindingsList(id="findings-list")
                    with TabPane("Log", id="log"):
                        yield LogPane(id="log-pane")
                    with TabPane("Plan", id="plan"):
                        yield PlanVsRun(id="plan-vs-run")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.query_one(ShardTree).focus()
        self.query_one(TabbedContent).hide_tab("plan")  # until the run has written a plan
        self.follow_run()

    def on_unmount(self) -> None:
        self._feeds_done.set()
        self._wake.set()

    def on_resize(self, event: object) -> None:
        self._fit(self.size)

    def _fit(self, size: Size, update: bool = True) -> None:
        """The layout of a narrow terminal; ``update=False`` before anything is styled (cheaper)."""
        self.set_class(size.width < NARROW_WIDTH, "-narrow", update=update)

    # -- the feed ------------------------------------------------------------------

    @work(thread=True, exclusive=True, exit_on_error=False, group="run-feed", name="run feed")
    def follow_run(self) -> None:
        worker = get_current_worker()
        feed = RunFeed(
            self.run_dir, refresh=self.refresh_s, findings=self.findings_of, follower=self._follower, now=self.clock
        )
        self._follower = None  # the feed's from now on
        while not worker.is_cancelled and not self._feeds_done.is_set():
            forced = self._wake.is_set()
            self._wake.clear()
            snap = feed.poll(force=forced)
            if snap is not None:
                self.post_message(self.Updated(snap))
            self._wake.wait(feed.every)

    @while_attached
    def on_run_screen_updated(self, message: Updated) -> None:
        snap = message.snapshot
        previous = self.snapshot
        self.snapshot = snap
        tree = self.query_one(ShardTree)
        oom_path = oom_module(snap)
        with self.app.batch_update():
            self.query_one(RunHeader).show(snap)
            self.query_one(RankMemory).show(snap.model)
            tree.empty_words = empty_tree_words(snap)
            # a run that ended before its model existed never gets a tree: give its space to the OOM
            self.set_class(snap.tree is None and not snap.live, "-treeless")
            tree.set_model(snap.tree, oom_path)
            tree.show_hosts(snap.model.ranks_by_host)
            self.query_one(OomPanel).show(snap.model, snap.findings)
            rehearsal = snap.model.rehearsal
            self.query_one(FindingsList).show(snap.findings, rehearsal.caveat if rehearsal is not None else "")
            self.query_one(LogPane).append(snap.new_log)
            self._show_plan(snap)
            if previous is None or previous.tree is not snap.tree or previous.findings is not snap.findings:
                self._show_details(tree.selected)
            if snap.model.ooms and not self._oom_seen:
                self._oom_seen = True
                tabs = self.query_one(TabbedContent)
                tabs.get_tab("oom").label = "✗ OOM"
                tabs.active = "oom"
                tree.jump_to_oom()
        if previous is not None and previous.live and not snap.live:
            self.notify(f"The run ended: {snap.status.describe()}. The view stays for reading.", timeout=8)

    def _show_plan(self, snap: RunSnapshot) -> None:
        check = snap.model.plan_check
        if check is None:
            return
        tabs = self.query_one(TabbedContent)
        tabs.show_tab("plan")
        tabs.get_tab("plan").label = "✗ Plan" if check.missed else "Plan"
        self.query_one(PlanVsRun).show(check)

    @on(ShardTree.Highlighted)
    def _tree_highlighted(self, event: ShardTree.Highlighted) -> None:
        self._show_details(event.node)

    def _show_details(self, node: Node | None) -> None:
        snap = self.snapshot
        if snap is not None:
            details = self.query_one(ModuleDetails)
            details.show(snap.tree, node, snap.findings, oom_module(snap), empty=empty_tree_words(snap))

    # -- actions -------------------------------------------------------------------

    def action_search(self) -> None:
        self.query_one(SearchBar).open()

    @on(Input.Changed, "#search")
    def _search_changed(self, event: Input.Changed) -> None:
        tree = self.query_one(ShardTree)
        tree.search(event.value)

    @on(SearchBar.Closed)
    def _search_closed(self) -> None:
        self.query_one(ShardTree).focus()

    def action_jump_oom(self) -> None:
        tree = self.query_one(ShardTree)
        if tree.jump_to_oom():
            self.query_one(TabbedContent).active = "oom"
            tree.focus()
        elif self.snapshot is not None and (story := self.snapshot.model.first_oom) is not None:
            self.query_one(TabbedContent).active = "oom"
            self.notify(no_module_words(story))
        else:
            self.notify("No rank of this run has run out of memory.")

    def action_tab(self, name: str) -> None:
        if name == "plan" and (self.snapshot is None or self.snapshot.model.plan_check is None):
            self.notify("This run wrote no plan (runs of presets plan themselves at set-up).")
            return
        self.query_one(TabbedContent).active = name

    def action_home(self) -> None:
        self.app.action_home()  # type: ignore[attr-defined]

    def action_report(self) -> None:
        self.notify("Writing the report…", timeout=2)
        self.make_report()

    @work(thread=True, exclusive=True, exit_on_error=False, group="report", name="report")
    def make_report(self) -> None:
        try:
            markdown = render_markdown(self.run_dir)
        except Exception as e:
            self.app.call_from_thread(self.notify, f"No report: {e}", severity="error", timeout=8)
            return
        saved = None if self.read_only else save_report(self.run_dir, markdown)
        self.post_message(self.ReportReady(markdown, saved))

    def on_run_screen_report_ready(self, message: ReportReady) -> None:
        self.app.push_screen(ReportScreen(message.markdown, message.saved))

    def commands(self) -> Iterable[SystemCommand]:
        """This screen's entries in the command palette."""
        yield SystemCommand("Go to the OOM", "Open the tree at the module that ran out of memory", self.action_jump_oom)
        yield SystemCommand("Search modules", "Find modules by path", self.action_search)
        yield SystemCommand("Report", "Write the Markdown report of this run", self.action_report)
        yield SystemCommand("Home", "GPUs, processes, runs and presets", self.action_home)


class ControlledRunScreen(RunScreen):
    """The run view with the one action that changes the run: stopping it."""

    BINDINGS = [Binding("k", "stop", "Stop run", tooltip="Stop this run (asks first)")]

    def action_stop(self) -> None:
        if self.snapshot is not None and not self.snapshot.live:
            self.notify(f"The run is not running ({self.snapshot.status.describe()}); nothing to stop.")
            return
        question = f"Stop run {self.run_dir.id}?"
        detail = f"Its processes get SIGTERM, then SIGKILL after {STOP_GRACE:.0f} s. The run directory stays."
        self.app.push_screen(ConfirmScreen(question, detail), self._stop_confirmed)

    def _stop_confirmed(self, yes: bool | None) -> None:
        if yes:
            self.notify(f"Stopping {self.run_dir.id}…", timeout=3)
            self.stop_run()

    @work(thread=True, exclusive=True, exit_on_error=False, group="stop", name="stop run")
    def stop_run(self) -> None:
        from shardtop.launch import stop  # only a stop needs the launcher

        stopped = stop(self.run_dir, grace=STOP_GRACE, out=lambda _line: None)
        words = f"Stopped {self.run_dir.id}." if stopped else f"{self.run_dir.id} was not running."
        self.app.call_from_thread(self.notify, words)
        self._wake.set()

    def commands(self) -> Iterable[SystemCommand]:
        yield from super().commands()
        yield SystemCommand("Stop run", "Stop this run's processes (asks first)", self.action_stop)
