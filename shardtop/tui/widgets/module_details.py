"""``ModuleDetails``: everything known about the selected module (or fold).

Past ``RANKS_LISTED`` ranks the per-rank figures are told together: ranks that
hold a module alike share one row (``r0–511  12.8K  cuda  sharded``), and a
container's holdings are given as their lowest…highest.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from shardtop.diagnose import Finding
from shardtop.read.shard_model import Fold, Node, ShardModel
from shardtop.rundir.events import Unit
from shardtop.tui.format import format_bytes, short_count
from shardtop.tui.host_groups import rank_spans
from shardtop.tui.widgets.findings_list import concerning, finding_text
from shardtop.units import short_bytes

RANKS_LISTED = 16
"""Ranks named one by one; more are grouped by what they hold."""


def unit_words(unit: Unit | None, model: ShardModel) -> str:
    """``fsdp2 unit at blocks.3: 1.05M of 2.10M elements here, FULL_SHARD, fp32``."""
    if unit is None:
        return "-"
    root = model.paths[unit.module] if 0 <= unit.module < model.size else "?"
    facts = [
        f"{unit.kind} unit at {root or 'model'}",
        f"{short_count(unit.local_numel)}/{short_count(unit.numel)} elements here",
    ]
    if unit.strategy:
        facts.append(unit.strategy)
    if unit.dtype:
        facts.append(unit.dtype)
    if unit.offload:
        facts.append("offloaded to CPU")
    return ", ".join(facts)


def offloaded_words(model: ShardModel, node: Node) -> str:
    """What each rank's engine holds of the node in host memory instead of on its device (parameters,
    gradients, optimizer state): ``r0 8.81G · r1 8.81G in host memory``; "" where nothing is."""
    if "offloaded" not in model.figures:
        return ""
    sizes = [(r, model.node_figure(node, r, "offloaded") or 0) for r in model.ranks]
    if not any(size for _, size in sizes):
        return ""
    if len(sizes) <= RANKS_LISTED:
        held = " · ".join(f"r{r} {short_bytes(size)}" for r, size in sizes)
    else:
        low, high = short_bytes(min(s for _, s in sizes)), short_bytes(max(s for _, s in sizes))
        held = f"{low if low == high else f'{low}…{high}'} on each of {len(sizes)} ranks"
    return f"{held} in host memory, by the engine's offload (not on the device)"


def details_text(model: ShardModel, node: Node, findings: tuple[Finding, ...], oom_path: str | None) -> Table:
    """The details pane's content for ``node``."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")  # code in a fix (`FSDPStrategy(auto_wrap_policy=...)`) breaks, never vanishes
    if isinstance(node, Fold):
        members = model.members(node)
        first = members[0]
        grid.add_row("modules", f"{model.paths[first]} … {model.paths[members[-1]]}")
        grid.add_row(
            "folded", f"{node.count} × {model.type_of(first)}, {short_count(model.params_total[first])} parameters each"
        )
        row = first
    else:
        row = node
        grid.add_row("module", model.paths[row] or "(the whole model)")
        grid.add_row("type", model.type_of(row))
        if oom_path is not None and model.paths[row] == oom_path:
            grid.add_row(Text("✗ OOM", style="bold"), "this module was running when the rank ran out of memory")
    params = model.node_params(node)
    full = model.node_full_bytes(node)
    own = model.tree.params[row] if not isinstance(node, Fold) else None
    grid.add_row(
        "parameters",
        f"{params:,} ({format_bytes(full)} unsharded)"
        + (f"; {own:,} its own" if own is not None and own != params else ""),
    )
    placed = model.placement(node)
    if placed.states and (isinstance(node, Fold) or own != params):
        where = f"{', '.join(placed.states)} on {', '.join(placed.devices)}"
        grid.add_row("held", where + (f" (rank {model.ranks[0]})" if len(model.ranks) > 1 else ""))
    if model.ranks and (isinstance(node, Fold) or not own):
        # a container: what each rank holds of it is all there is to say per rank
        if len(model.ranks) <= RANKS_LISTED:
            held = [f"r{r} {short_bytes(model.node_bytes(node, r))}" for r in model.ranks]
            grid.add_row("per rank", " · ".join(held))
        else:
            sizes = [model.node_bytes(node, r) for r in model.ranks]
            low, high = short_bytes(min(sizes)), short_bytes(max(sizes))
            grid.add_row("per rank", f"{low if low == high else f'{low}…{high}'} on each of {len(sizes)} ranks")
        seen = {unit_words(cell.unit, model) for cell in model.rank_cells(row)}
        words = seen.pop() if len(seen) == 1 else "differs between ranks"
        grid.add_row("unit", words if words != "-" else Text("in no sharding unit", style="italic"))
    elif model.ranks:
        per_rank = Table("rank", "holds", "device", "state", box=None, padding=(0, 1), show_edge=False)
        units: dict[str, list[int]] = {}
        alike: dict[tuple[str, str, str], list[int]] = {}
        for cell in model.rank_cells(row):
            held_here = (short_bytes(model.node_bytes(node, cell.rank)), cell.device or "-", cell.state or "-")
            if len(model.ranks) <= RANKS_LISTED:
                per_rank.add_row(f"r{cell.rank}", *held_here)
            alike.setdefault(held_here, []).append(cell.rank)
            units.setdefault(unit_words(cell.unit, model), []).append(cell.rank)
        if len(model.ranks) > RANKS_LISTED:
            for held_here, ranks in alike.items():
                per_rank.add_row(rank_spans(ranks), *held_here)
        grid.add_row("per rank", per_rank)
        for words, ranks in units.items():
            named = ",".join(f"r{r}" for r in ranks) if len(model.ranks) <= RANKS_LISTED else rank_spans(ranks)
            label = "unit" if len(units) == 1 else f"unit {named}"
            grid.add_row(label, words if words != "-" else Text("in no sharding unit", style="italic"))
    else:
        grid.add_row("per rank", Text("no shards reported yet", style="dim"))
    moved = offloaded_words(model, node)
    if moved:
        grid.add_row("offloaded", moved)
    path = model.paths[row] if not isinstance(node, Fold) else model.paths[node.parent]
    related = concerning(findings, path)
    if related:
        grid.add_row("findings", Text("\n").join(finding_text(f) for f in related))
    return grid


class ModuleDetails(VerticalScroll):
    """Parameters, bytes on each rank, unit/partition, state, device and findings of one module."""

    DEFAULT_CSS = """
    ModuleDetails > Static {
        height: auto;
    }
    """

    def compose(self) -> ComposeResult:
        yield Static("Select a module in the shard tree.", id="details-text")

    def show(
        self,
        model: ShardModel | None,
        node: Node | None,
        findings: tuple[Finding, ...],
        oom_path: str | None,
        empty: str = "No module tree yet: the ranks send it once the model is built.",
    ) -> None:
        """``empty``: what to say without a tree (a run that failed before its model existed says why)."""
        body = self.query_one("#details-text", Static)
        if model is None or node is None:
            body.update(empty)
            return
        body.update(details_text(model, node, findings, oom_path))
