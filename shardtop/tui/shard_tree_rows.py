"""What each line of the shard tree says: its title, its header, and a module's row as styled cells.

``ShardTree`` draws these: ``header_text`` is the line over the columns,
``name_cells`` the guides, expander, name and OOM mark of a row, and
``figure_cells`` its type, parameter count, state, device and one figure per
rank column (or the min…max of all ranks where they do not fit).  The widget
cuts them to its columns (``fit``) and caches the strips.  The
styles come in from the widget: ``base`` for the line, ``style`` for each
component class.  Pure: no Textual.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style

from shardtop.read.shard_model import Figure, Fold, Node, ShardModel
from shardtop.read.tree_lines import Line
from shardtop.tui.format import short_count
from shardtop.tui.host_groups import RankColumn
from shardtop.tui.tree_columns import OOM_WORDS, TreeColumns, cut, module_heading
from shardtop.units import short_bytes

TITLE = "Shard tree"
ON_CURSOR_PLAIN = frozenset({"shard-tree--fold", "shard-tree--device", "shard-tree--guides"})
"""Colours that would sink into the cursor's background: the cursor line draws these plain."""
HOST_SEPARATOR = "│"
"""Drawn in place of the space before the first rank column of each host after the first."""

ComponentStyle = Callable[[str], Style]
"""The style of a ``shard-tree--*`` component class as the line being drawn shows it."""


def breadcrumb(model: ShardModel | None, node: Node | None) -> str:
    """The tree's title: where the selected line is, since 18 000 siblings can push its parents off screen."""
    if model is None or node is None:
        return TITLE
    if isinstance(node, Fold):
        parent = model.paths[node.parent]
        where = f"{parent}.{{{model.fold_label(node)}}}" if parent else f"{{{model.fold_label(node)}}}"
    else:
        where = model.paths[node]
    return f"{TITLE} · {where}" if where else TITLE


def wrapped(words: str, width: int) -> list[str]:
    """``words`` wrapped to a pane ``width`` cells wide, each of its lines (a rank's doing) starting a line
    of its own."""
    return [w for para in words.splitlines() for w in textwrap.wrap(para, max(10, width - 2)) or [""]]


def header_text(figure: Figure, cols: TreeColumns, rank_columns: Sequence[RankColumn]) -> str:
    """The header line: what each column holds, and over the module names what the rank columns count."""
    cells = [module_heading(figure, cols.name), " ", "type".ljust(cols.type), " ", "params".rjust(cols.params)]
    if cols.state:
        cells += [" ", "state".ljust(cols.state)]
    if cols.device:
        cells += [" ", "device".ljust(cols.device)]
    for column in rank_columns[: cols.ranks_shown]:
        cells += [HOST_SEPARATOR if column.starts_host else " ", f"r{column.rank}".rjust(cols.rank)]
    if cols.range:
        cells += [" ", "per rank".rjust(cols.range)]
    return "".join(cells)


def name_cells(
    model: ShardModel,
    line: Line,
    base: Style,
    style: ComponentStyle,
    *,
    marks: frozenset[Node],
    oom_path: str | None,
    matches: frozenset[int],
) -> list[tuple[str, Style]]:
    """The name column of ``line``: its guides, ``▶``/``▼``, the module's name (a fold: its range, count and
    type), a search match highlighted, and ``✗ OOM`` on the culprit or ``✗`` on the way to it (``marks``)."""
    node = line.node
    expander = ("▼ " if line.expanded else "▶ ") if line.expandable else "  "
    name: list[tuple[str, Style]] = [(line.guide, base + style("shard-tree--guides")), (expander, base)]
    if isinstance(node, Fold):
        first = model.members(node)[0]
        name.append(
            (f"{model.fold_label(node)}  {node.count} × {model.type_of(first)}", base + style("shard-tree--fold"))
        )
    else:
        label_style = base + style("shard-tree--match") if node in matches else base
        name.append((model.name_of(node), label_style))
    if node in marks:
        culprit = not isinstance(node, Fold) and model.paths[node] == oom_path
        if culprit:
            name.append((f"  {OOM_WORDS}", base + style("shard-tree--oom")))
        else:
            where = f" in {oom_path.rsplit('.', 1)[-1]}" if isinstance(node, Fold) and oom_path else ""
            name.append((f"  ✗{where}", base + style("shard-tree--oom-path")))
    return name


def figure_cells(
    model: ShardModel,
    node: Node,
    cols: TreeColumns,
    base: Style,
    style: ComponentStyle,
    *,
    figure: Figure,
    rank_columns: Sequence[RankColumn],
) -> list[tuple[str, Style]]:
    """The columns right of the name: type, parameters, state (``◆`` where a sharding unit is rooted),
    device, then ``figure``'s bytes on each rank shown, or their min…max over every rank."""
    first = model.members(node)[0] if isinstance(node, Fold) else node
    cells = [
        (" ", base),
        (cut(model.type_of(first), cols.type), base + style("shard-tree--type")),
        (" ", base),
        (short_count(model.node_params(node)).rjust(cols.params), base),
    ]
    if cols.state or cols.device:
        placed = model.placement(node)
        if cols.state:
            unit = "◆ " if first in model.unit_roots else ""
            cells += [(" ", base), (cut(unit + placed.state, cols.state), base + style("shard-tree--unit"))]
        if cols.device:
            cells += [(" ", base), (cut(placed.device, cols.device), base + style("shard-tree--device"))]
    for column in rank_columns[: cols.ranks_shown]:
        before = (HOST_SEPARATOR, base + style("shard-tree--guides")) if column.starts_host else (" ", base)
        value = model.node_figure(node, column.rank, figure)
        cells += [before, (short_bytes(value).rjust(cols.rank), base)]
    if cols.range and model.ranks:
        known = [v for r in model.ranks if (v := model.node_figure(node, r, figure)) is not None]
        low, high = short_bytes(min(known, default=None)), short_bytes(max(known, default=None))
        cells += [(" ", base), ((low if low == high else f"{low}…{high}").rjust(cols.range), base)]
    return cells


def fit(parts: Sequence[tuple[str, Style]], width: int, pad: Style) -> list[Segment]:
    """Segments of ``parts`` cut or padded to exactly ``width`` cells (cut text ends in …)."""
    out: list[Segment] = []
    used = 0
    for text, style in parts:
        n = cell_len(text)
        if used + n > width:
            room = width - used
            if room > 0:
                cut_text = text[: max(0, room - 1)]
                out.append(Segment(cut_text + "…", style))
                used += cell_len(cut_text) + 1
            break
        out.append(Segment(text, style))
        used += n
    if used < width:
        out.append(Segment(" " * (width - used), pad))
    return out
