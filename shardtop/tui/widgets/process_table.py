"""``ProcessTable``: the processes holding GPU memory, diffed by pid."""

from __future__ import annotations

from collections.abc import Mapping

from textual.widgets.data_table import RowDoesNotExist

from shardtop.gpus import GpuProcessInfo
from shardtop.tui.format import PROCESS_COLUMNS as COLUMNS
from shardtop.tui.format import process_cells
from shardtop.tui.repaint import CellsTable
from shardtop.tui.watch.run_catalog import RankOwner

__all__ = ["COLUMNS", "ProcessTable", "process_cells"]


class ProcessTable(CellsTable):
    """Processes on the GPUs (NVML + psutil); rows keyed by pid, only changed cells repainted."""

    DEFAULT_CSS = """
    ProcessTable {
        height: auto;
        max-height: 10;
    }
    """

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=False)
        self.border_title = "Processes on the GPUs"

    def on_mount(self) -> None:
        for name in COLUMNS:
            self.add_column(name, key=name)

    def show(self, processes: tuple[GpuProcessInfo, ...], owners: Mapping[int, RankOwner]) -> None:
        wanted = {str(p.pid): process_cells(p, owners) for p in processes}
        for gone in [k for k in self.rows if k.value not in wanted]:
            self.remove_row(gone)
        for key, cells in wanted.items():
            try:
                self.get_row(key)
            except RowDoesNotExist:
                self.add_row(*cells, key=key)
                continue
            self.update_row(key, zip(COLUMNS, cells, strict=True))
        count = len(processes)
        self.set_border_text(subtitle=f"{count} process{'es' if count != 1 else ''}" if processes else "none")
