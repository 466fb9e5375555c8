"""``attach``'s first frame: the top of a run's view as plain text, drawn before Textual loads.

Textual needs most of a second to import and lay out the run view; nvitop draws
in under 0.3 s.  So ``shardtop attach`` reads the head of each rank's event
file (``RunFollower.read_first``: the hello, the tree and the shards come
first), and ``first_frame.painted`` draws from it the header, each rank's
memory bar and the shard tree opened as the view opens it (down to the module
that ran out of memory), in the words of the run view (``header_info``,
``tree_columns``, ``format``).  Textual then takes the screen over, and the same
follower reads on.  Pure: no Textual.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING

from shardtop.read.follower import RunFollower
from shardtop.read.run_model import RunModel
from shardtop.read.shard_model import Fold, Node, ShardModel
from shardtop.read.tree_lines import Line, default_expanded, iter_lines_from, iter_visible_lines, oom_marks
from shardtop.rundir.run_directory import RunDirectory
from shardtop.tui.bar_scale import host_scale
from shardtop.tui.format import bar, duration, fraction, short_count, truncate
from shardtop.tui.header_info import header_parts, run_header_info
from shardtop.tui.tree_columns import OOM_WORDS, cut, module_heading, tree_columns
from shardtop.units import format_bytes, short_bytes

if TYPE_CHECKING:
    from shardtop.tui.first_frame import Frame

BAR_CELLS = 24


def header_lines(model: RunModel, run: RunDirectory, now: float) -> list[str]:
    """The run header's two lines, as ``RunHeader`` draws them."""
    info = run_header_info(model, run)
    end = info.ended if info.ended is not None else now
    elapsed = duration(max(0.0, end - info.started)) if info.started is not None else ""
    return ["".join(text for text, _ in parts) for parts in header_parts(info, elapsed)]


def memory_lines(model: RunModel, whole: bool = True) -> list[str]:
    """One line per rank: which rank, how it ended, and its allocated memory against what it may use.

    ``whole``: every event was read; else a rank is said to have ended only where its own exit or
    OOM was read (one not read yet is not lost).
    """
    lines = []
    for r in model.ranks:
        rs = r.state
        m, oom = rs.memory, rs.oom
        allocated = oom.allocated if oom is not None and oom.allocated is not None else m.allocated if m else None
        limit = (m.limit if m else None) or (oom.limit if oom else None) or model.memory_limit_of(r)
        ended = r.status.ended and (whole or rs.exit is not None or oom is not None)
        how = f" {r.status.mark} {'OOM' if r.status.state == 'out of memory' else r.status.state}"
        label = f" r{r.rank} {rs.device or '?'}" + (how if ended else "")
        if allocated is None:  # a CPU rank: its rss of its host's memory, as the run view's bar has it
            rss = rs.memory.host_rss if rs.memory else 0
            host, _ = host_scale(r)
            drawn = "".join(bar(fraction(rss, host), BAR_CELLS)) + " " if host else ""
            of = f" / {format_bytes(host)}" if host else ""
            lines.append(f"{label}  {drawn}rss {format_bytes(rss) if rss else '-'}{of}")
            continue
        filled, empty = bar(fraction(allocated, limit), BAR_CELLS)
        of = f" / {format_bytes(limit)}" if limit else ""
        lines.append(f"{label}  {filled}{empty} {format_bytes(allocated)}{of}")
    return lines or [" waiting for the ranks…"]


def opened(tree: ShardModel, oom_path: str | None) -> set[Node]:
    """What the view opens: the root down its single children, and the way to the OOM's module."""
    nodes = default_expanded(tree)
    row = tree.row_of(oom_path) if oom_path is not None else None
    if row is not None:
        nodes.update(tree.reveal(row))
    return nodes


def tree_line(tree: ShardModel, line: Line, width: int, marks: frozenset[Node], oom_path: str | None) -> str:
    """One line of the shard tree: guides, name (or fold), type, parameters and each rank's bytes."""
    cols = tree_columns(width, len(tree.ranks))
    node = line.node
    expander = ("▼ " if line.expanded else "▶ ") if line.expandable else "  "
    if isinstance(node, Fold):
        first = tree.members(node)[0]
        label = f"{tree.fold_label(node)}  {node.count} × {tree.type_of(first)}"
    else:
        first, label = node, tree.name_of(node)
    if node in marks:
        culprit = not isinstance(node, Fold) and tree.paths[node] == oom_path
        label += f"  {OOM_WORDS}" if culprit else "  ✗"
    cells = [cut(line.guide + expander + label, cols.name), " ", cut(tree.type_of(first), cols.type), " ",
             short_count(tree.node_params(node)).rjust(cols.params)]
    if cols.state or cols.device:
        placed = tree.placement(node)
        if cols.state:
            unit = "◆ " if first in tree.unit_roots else ""
            cells += [" ", cut(unit + placed.state, cols.state)]
        if cols.device:
            cells += [" ", cut(placed.device, cols.device)]
    for rank in tree.ranks[: cols.ranks_shown]:
        cells += [" ", short_bytes(tree.node_figure(node, rank)).rjust(cols.rank)]
    if cols.range and tree.ranks:
        known = [v for r in tree.ranks if (v := tree.node_figure(node, r)) is not None]
        low, high = short_bytes(min(known, default=None)), short_bytes(max(known, default=None))
        cells += [" ", (low if low == high else f"{low}…{high}").rjust(cols.range)]
    return "".join(cells).rstrip()


def tree_lines(tree: ShardModel | None, width: int, oom_path: str | None, room: int) -> list[str]:
    """The tree's header and its first lines, at most ``room`` in all."""
    if tree is None:
        return ["Shard tree", " No module tree yet."]
    cols = tree_columns(width, len(tree.ranks))
    heading = [module_heading("params", cols.name), " ", "type".ljust(cols.type), " ", "params".rjust(cols.params)]
    heading += [" ", "state".ljust(cols.state)] if cols.state else []
    heading += [" ", "device".ljust(cols.device)] if cols.device else []
    heading += [x for rank in tree.ranks[: cols.ranks_shown] for x in (" ", f"r{rank}".rjust(cols.rank))]
    heading += [" ", "per rank".rjust(cols.range)] if cols.range else []
    marks = oom_marks(tree, oom_path)
    row = tree.row_of(oom_path) if oom_path is not None else None
    lines = shown_lines(tree, opened(tree, oom_path), row, max(0, room - 2))
    title = f"Shard tree · {oom_path}" if row is not None else "Shard tree"
    return [title, "".join(heading).rstrip(), *(tree_line(tree, line, width, marks, oom_path) for line in lines)]


def shown_lines(tree: ShardModel, expanded: set[Node], culprit: int | None, room: int) -> list[Line]:
    """The first ``room`` lines, or ``room`` lines with the culprit's in the middle, as the view jumps to it.

    The walk to the culprit starts a screen's worth of siblings before it (story 2's culprit is the
    15 331st of 18 000), not at the top: each sibling before it is at least one line.
    """
    if culprit is None:
        return list(islice(iter_visible_lines(tree, expanded), room))
    half = max(1, (room + 1) // 2)
    before: deque[Line] = deque(maxlen=half)
    lines = _lines_before(tree, expanded, culprit, half)
    for line in lines:
        before.append(line)
        if line.node == culprit:
            break
    return [*before, *islice(lines, max(0, room - len(before)))]


def _lines_before(tree: ShardModel, expanded: set[Node], culprit: int, need: int) -> Iterator[Line]:
    """Visible lines from at least ``need`` lines before the culprit's (or from the top) on."""
    way = [*tree.reveal(culprit), culprit]
    for level in range(len(way) - 2, -1, -1):
        at = tree.kids_of(way[level]).index(way[level + 1])
        if at >= need:
            return iter_lines_from(tree, expanded, way[: level + 1], at - need)
    return iter_visible_lines(tree, expanded)


def run_frame_lines(
    model: RunModel,
    tree: ShardModel | None,
    run: RunDirectory,
    width: int,
    height: int,
    unread: int = 0,
    clock: Callable[[], float] = time.time,
) -> list[str]:
    """The frame, at most ``height`` lines of at most ``width`` cells; the tree gets what the rest leaves.

    ``unread``: bytes of the event files not read yet, said on the last line.
    """
    story = model.first_oom
    oom_path = story.module if story is not None else None
    top = [*header_lines(model, run, clock()), "", "Memory per rank", *memory_lines(model, not unread), ""]
    bottom = [f" {OOM_WORDS}: {story.headline}"] if story is not None else []
    if unread:
        bottom.append(f" reading {format_bytes(unread)} more of the run's events…")
    room = max(0, height - len(top) - len(bottom))
    lines = top + tree_lines(tree, width, oom_path, room)[:room] + bottom
    return [truncate(line, width) for line in lines[:height]]


def run_frame(follower: RunFollower, clock: Callable[[], float] = time.time) -> Frame:
    """Read the head of the run's event files (the follower reads on from there) and draw from it."""
    model = follower.read_first()
    tree = ShardModel.of(model.state)
    unread = follower.unread_bytes
    return lambda width, height: run_frame_lines(model, tree, follower.run, width, height, unread, clock)
