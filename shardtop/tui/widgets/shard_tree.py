"""``ShardTree``: module path, type, parameters and bytes held on each rank, drawn line by line.

A ``ScrollView`` on the Line API: ``render_line`` draws only the lines on
screen, from a cache keyed by a generation counter that changes whenever what
the lines show changes (model, OOM marks, search matches, theme).  Repeated
siblings are folded (``net.0 … net.17999  18000 × Linear``) and a line's
children are only computed when it is opened, so 100 000 modules cost what is
visible.  The rank columns of a run over several hosts go host by host, a ``│``
where a host begins; the border's subtitle says which ranks each host ran.
``c`` chooses what the rank columns count (``ShardModel.node_figure``):
parameter, gradient, optimizer or activation bytes, what the engine offloads
to host memory (where it offloads any), or their total on the device; the
header says which, and a rank without that figure reads ``-``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from rich.cells import cell_len
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from shardtop.read.shard_model import FIGURES, Figure, Fold, Node, ShardModel
from shardtop.read.tree_lines import (
    Line,
    default_expanded,
    line_of,
    lines_below,
    oom_marks,
    parent_line,
    subtree_end,
    translate_expanded,
    visible_lines,
)
from shardtop.tui.host_groups import RankColumn, hosts_caption, rank_columns
from shardtop.tui.repaint import set_border_text
from shardtop.tui.shard_tree_rows import (
    ON_CURSOR_PLAIN,
    TITLE,
    breadcrumb,
    figure_cells,
    fit,
    header_text,
    name_cells,
    wrapped,
)
from shardtop.tui.tree_columns import TreeColumns, tree_columns
from shardtop.words import plural


class ShardTree(ScrollView, can_focus=True):
    """The module → device shard tree of one run."""

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "first", "First", show=False),
        Binding("end", "last", "Last", show=False),
        Binding("enter,space", "toggle_node", "Open/close"),
        Binding("right", "open", "Open", show=False),
        Binding("left", "close", "Close/parent", show=False),
        Binding("c", "next_figure", "Columns"),
        Binding("n", "next_match(1)", "Next match", show=False),
        Binding("N", "next_match(-1)", "Previous match", show=False),
    ]

    COMPONENT_CLASSES = {
        "shard-tree--header",
        "shard-tree--cursor",
        "shard-tree--guides",
        "shard-tree--fold",
        "shard-tree--type",
        "shard-tree--unit",
        "shard-tree--device",
        "shard-tree--oom",
        "shard-tree--oom-path",
        "shard-tree--match",
    }

    DEFAULT_CSS = """
    ShardTree {
        height: 1fr;
        overflow-x: hidden;
    }
    """

    cursor: reactive[int] = reactive(0, repaint=False)
    """Index of the selected line among the visible lines."""
    figure: reactive[Figure] = reactive[Figure]("params", repaint=False)
    """What the rank columns count per module: parameters, gradients, optimizer state, activations or their total."""
    empty_words: reactive[str] = reactive("No module tree yet: the ranks send it once the model is built.")
    """What the tree says while it has no model (a run that failed before its model existed says why)."""

    class Highlighted(Message):
        """The cursor is on another module (or fold)."""

        def __init__(self, tree: ShardTree, node: Node | None) -> None:
            super().__init__()
            self.tree = tree
            self.node = node

        @property
        def control(self) -> ShardTree:
            return self.tree

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.model: ShardModel | None = None
        self._expanded: set[Node] = set()
        self._lines: list[Line] = []
        self._generation = 0
        self._cache: LRUCache[tuple[object, ...], Strip] = LRUCache(1024)
        self._oom_path: str | None = None
        self._marks: frozenset[Node] = frozenset()
        self._matches: list[int] = []
        self._match_rows: frozenset[int] = frozenset()
        self._match_pos = -1
        self._ranks_by_host: Mapping[str, tuple[int, ...]] = MappingProxyType({})
        self._rank_columns: tuple[RankColumn, ...] = ()
        self._search_words = ""
        self.border_title = TITLE

    # -- what it shows -----------------------------------------------------------

    @property
    def lines(self) -> Sequence[Line]:
        return self._lines

    @property
    def selected(self) -> Node | None:
        return self._lines[self.cursor].node if 0 <= self.cursor < len(self._lines) else None

    def set_model(self, model: ShardModel | None, oom_path: str | None = None) -> None:
        """Show a new model (or OOM), keeping what was open and the selected module."""
        if model is self.model and oom_path == self._oom_path:
            return
        selected = self._selected_path()
        if model is not self.model:
            if model is None:
                self._expanded = set()
            elif self.model is None:
                self._expanded = default_expanded(model)
            else:
                self._expanded = translate_expanded(self.model, model, self._expanded)
            self.model = model
            self._matches, self._match_rows, self._match_pos = [], frozenset(), -1
            self._rank_columns = rank_columns(model.ranks if model else (), self._ranks_by_host)
        self._oom_path = oom_path
        self._marks = oom_marks(model, oom_path) if model is not None else frozenset()
        self._rebuild()
        row = model.row_of(selected) if model is not None and selected is not None else None
        self._move_to(line_of(self._lines, row) if row is not None else min(self.cursor, max(0, len(self._lines) - 1)))
        self._announce()

    def show_hosts(self, ranks_by_host: Mapping[str, tuple[int, ...]]) -> None:
        """Which ranks ran on which host (``RunModel.ranks_by_host``): the columns' order and the subtitle."""
        if ranks_by_host == self._ranks_by_host:
            return
        self._ranks_by_host = ranks_by_host
        self._rank_columns = rank_columns(self.model.ranks if self.model else (), ranks_by_host)
        self._caption()
        self._invalidate()

    def _caption(self) -> None:
        """The subtitle: the search's count while there is one, else the hosts and their ranks."""
        set_border_text(self, subtitle=self._search_words or hosts_caption(self._ranks_by_host))

    def jump_to_oom(self) -> bool:
        """Open the tree to the module that ran out of memory and select it."""
        if self.model is None or self._oom_path is None:
            return False
        row = self.model.row_of(self._oom_path)
        if row is None:
            return False
        self.reveal(row)
        return True

    def reveal(self, row: int) -> None:
        """Open everything above ``row``, select it and scroll it to the middle."""
        if self.model is None:
            return
        closed = [node for node in self.model.reveal(row) if node not in self._expanded]
        if closed:  # rebuild only when something has to open (search steps mostly stay in open parts)
            self._expanded.update(closed)
            self._rebuild()
        self._move_to(line_of(self._lines, row), center=True)
        self._announce()

    def search(self, query: str) -> int:
        """Mark modules whose path contains ``query`` and go to the first; returns how many (said in the subtitle)."""
        self._matches = self.model.search(query) if self.model is not None else []
        self._match_rows = frozenset(self._matches)
        self._match_pos = -1
        self._invalidate()
        if self._matches:
            self.action_next_match(1)
        count = len(self._matches)
        self._search_words = plural(count, "match", "matches") if query else ""
        self._caption()
        return count

    @property
    def match_count(self) -> int:
        return len(self._matches)

    # -- actions -----------------------------------------------------------------

    def action_cursor(self, delta: int) -> None:
        self._move_to(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self._move_to(self.cursor + direction * max(1, self.size.height - 2))

    def action_first(self) -> None:
        self._move_to(0)

    def action_last(self) -> None:
        self._move_to(len(self._lines) - 1)

    def action_toggle_node(self) -> None:
        if 0 <= self.cursor < len(self._lines):
            line = self._lines[self.cursor]
            self._set_open(self.cursor, not line.expanded)

    def action_open(self) -> None:
        if 0 <= self.cursor < len(self._lines) and not self._lines[self.cursor].expanded:
            self._set_open(self.cursor, True)

    def action_close(self) -> None:
        if not 0 <= self.cursor < len(self._lines):
            return
        line = self._lines[self.cursor]
        if line.expanded:
            self._set_open(self.cursor, False)
            return
        parent = parent_line(self._lines, self.cursor)
        if parent >= 0:
            self._move_to(parent)

    def action_next_figure(self) -> None:
        """The rank columns count the next kind of memory (``ShardModel.figures``, round)."""
        figures = self.model.figures if self.model is not None else FIGURES
        at = figures.index(self.figure) if self.figure in figures else -1
        self.figure = figures[(at + 1) % len(figures)]

    def watch_figure(self) -> None:
        self._invalidate()

    def action_next_match(self, delta: int) -> None:
        if not self._matches:
            return
        self._match_pos = (self._match_pos + delta) % len(self._matches)
        self.reveal(self._matches[self._match_pos])
        self._search_words = f"match {self._match_pos + 1}/{len(self._matches)}"
        self._caption()

    # -- lines ---------------------------------------------------------------------

    def _set_open(self, index: int, is_open: bool) -> None:
        """Open or close one line by splicing its descendants in or out: no full rebuild."""
        line = self._lines[index]
        if not line.expandable or self.model is None:
            return
        end = subtree_end(self._lines, index)
        if is_open:
            self._expanded.add(line.node)
            new = Line(line.node, line.guide, True, True)
            below = lines_below(self.model, new, self._expanded)
        else:
            self._expanded.discard(line.node)
            new, below = Line(line.node, line.guide, True, False), []
        self._lines[index:end] = [new, *below]
        self._invalidate()
        self._move_to(index)

    def _rebuild(self) -> None:
        self._lines = visible_lines(self.model, self._expanded) if self.model is not None else []
        self._invalidate()

    def _invalidate(self) -> None:
        self._generation += 1
        self._cache.clear()
        self.virtual_size = Size(0, len(self._lines) + 1)
        self.refresh()

    def _selected_path(self) -> str | None:
        node = self.selected
        if self.model is None or node is None:
            return None
        return self.model.paths[self.model.members(node)[0] if isinstance(node, Fold) else node]

    def _move_to(self, index: int, center: bool = False) -> None:
        index = max(0, min(index, len(self._lines) - 1))
        old = self.cursor
        if index != old:
            self.cursor = index
            self.refresh_line(old + 1)
            self.refresh_line(index + 1)
            self._announce()
        if center:
            self.call_after_refresh(self._scroll_to_cursor, True)
        else:
            self._scroll_to_cursor()

    def _scroll_to_cursor(self, center: bool = False) -> None:
        rows = max(1, self.scrollable_content_region.height - 1)
        top = round(self.scroll_y)
        if center:
            target = self.cursor - rows // 2
        elif self.cursor < top:
            target = self.cursor
        elif self.cursor >= top + rows:
            target = self.cursor - rows + 1
        else:
            return
        self.scroll_to(y=max(0, target), animate=False)

    def _announce(self) -> None:
        self.border_title = breadcrumb(self.model, self.selected)
        self.post_message(self.Highlighted(self, self.selected))

    # -- mouse -----------------------------------------------------------------

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y == 0:
            return
        index = round(self.scroll_y) + offset.y - 1
        if not 0 <= index < len(self._lines):
            return
        self._move_to(index)
        line = self._lines[index]
        if event.chain >= 2 or offset.x < cell_len(line.guide) + 2:
            self._set_open(index, not line.expanded)

    # -- drawing -------------------------------------------------------------------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._generation += 1
        self._cache.clear()

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if y == 0:
            return self._cached(("header", self._generation, width), lambda: self._header(width))
        index = round(self.scroll_y) + y - 1
        if index >= len(self._lines):
            return self._empty_line(y, width)
        selected = index == self.cursor
        return self._cached(
            (index, self._generation, width, selected, self.has_focus),
            lambda: self._row(self._lines[index], width, selected),
        )

    def _cached(self, key: tuple[object, ...], make: object) -> Strip:
        strip = self._cache.get(key)
        if strip is None:
            strip = self._cache[key] = make()  # type: ignore[operator]
        return strip

    def _columns(self, width: int) -> TreeColumns:
        return tree_columns(width, len(self.model.ranks) if self.model else 0)

    def _header(self, width: int) -> Strip:
        style = self.rich_style + self.get_component_rich_style("shard-tree--header")
        text = header_text(self.figure, self._columns(width), self._rank_columns)
        return Strip(fit([(text, style)], width, style))

    def _empty_line(self, y: int, width: int) -> Strip:
        """Without a model the lines under the header say why (``empty_words``, wrapped); else they are blank."""
        words = wrapped(self.empty_words, width) if self.model is None else []
        if not 1 <= y <= len(words):
            return Strip.blank(width, self.rich_style)
        style = self.rich_style + self.get_component_rich_style("shard-tree--type")
        return Strip(fit([(f" {words[y - 1]}", style)], width, self.rich_style))

    def _row(self, line: Line, width: int, selected: bool) -> Strip:
        model = self.model
        assert model is not None
        base = self.rich_style
        if selected:
            base = base + self.get_component_rich_style("shard-tree--cursor", partial=True)

        def cs(name: str) -> Style:
            if selected and name in ON_CURSOR_PLAIN:
                return Style()
            return self.get_component_rich_style(name, partial=True)

        cols = self._columns(width)
        name = name_cells(model, line, base, cs, marks=self._marks, oom_path=self._oom_path, matches=self._match_rows)
        cells = figure_cells(model, line.node, cols, base, cs, figure=self.figure, rank_columns=self._rank_columns)
        return Strip(fit(name, cols.name, base) + fit(cells, max(0, width - cols.name), base), width)
