"""``ProcessTable``: the processes holding GPU memory, diffed by pid."""

from __future__ import annotations

from collections.abc import Mapping

from textual.widgets.data_table import RowDoesNotExist

from shardtop.gpus import GpuProcessInfo
from shardtop.tui.format import short_bytes, short_run_id, truncate
from shardtop.tui.repaint import CellsTable
from shardtop.tui.watch.run_catalog import RankOwner

COLUMNS = ("PID", "USER", "GPU", "GPU MEM", "CPU %", "RSS", "RUN / RANK", "COMMAND")


def process_cells(p: GpuProcessInfo, owners: Mapping[int, RankOwner]) -> tuple[str, ...]:
    """The table's cells for one process, in words where psutil could not look."""
    owner = owners.get(p.pid)
    run = f"{short_run_id(owner.run_id)} r{owner.rank}" if owner else ""
    gpus = ",".join(str(g) for g in p.gpus)
    if p.visibility == "not-visible":
        return (
            str(p.pid),
            "?",
            gpus,
            short_bytes(p.gpu_memory),
            "-",
            "-",
            run,
            "not visible (another pid namespace, e.g. a container)",
        )
    command = truncate(p.command, 120) if p.command else "(hidden: other user)"
    user = p.user + (" (other user)" if p.visibility == "other-user" else "")
    cpu = f"{p.cpu_percent:.0f}" if p.cpu_percent is not None else "-"
    return (str(p.pid), user, gpus, short_bytes(p.gpu_memory), cpu, short_bytes(p.host_rss), run, command)


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
