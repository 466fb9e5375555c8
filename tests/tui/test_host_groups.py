"""The pure parts of drawing a run by host: spans, captions, column order, host summaries, titles."""

from __future__ import annotations

from dataclasses import replace

from shardtop.read.rank_facts import RankStatus, worst_status
from shardtop.rundir.memory_figures import GpuMemory
from shardtop.tui.host_groups import by_host, hosts_caption, rank_columns, rank_spans
from shardtop.tui.host_memory import fitted, host_memory_rows
from shardtop.tui.rank_memory_rows import RankMemoryRow
from shardtop.tui.watch.run_catalog import HostGpus
from shardtop.tui.widgets.gpu_panel import panel_title
from shardtop.tui.widgets.remote_gpus import gpu_lines_fit, used_span, util_span
from shardtop.tui.widgets.run_list import hosts_cell

GIB = 1024**3


def test_rank_spans_join_consecutive_ranks() -> None:
    assert rank_spans([0, 1, 2, 3]) == "r0–3"
    assert rank_spans([11, 10, 0, 1, 2, 3, 8]) == "r0–3,8,10–11"
    assert rank_spans([5]) == "r5"
    assert rank_spans([]) == ""


def test_the_caption_says_which_ranks_each_host_ran() -> None:
    assert hosts_caption({"gpu-a": (0, 1, 2, 3), "gpu-b": (4, 5, 6, 7)}) == "2 hosts: gpu-a r0–3 · gpu-b r4–7"
    assert hosts_caption({"gpu-a": (0, 1)}) == "", "one host: nothing to tell apart"
    many = {f"gpu-{h:03d}": tuple(range(8 * h, 8 * h + 8)) for h in range(64)}
    caption = hosts_caption(many)
    assert caption.startswith("64 hosts: gpu-000 r0–7 · gpu-001 r8–15 · ")
    assert caption.endswith("gpu-007 r56–63 · +56 more")


def test_rank_columns_go_host_by_host_with_a_mark_where_a_host_begins() -> None:
    # c10d gave node-b node rank 0: ranks 0-1 ran there, 2-3 on node-a (the recorded two-host run)
    columns = rank_columns((0, 1, 2, 3), {"node-a": (2, 3), "node-b": (0, 1)})
    assert [(c.rank, c.host, c.starts_host) for c in columns] == [
        (2, "node-a", False),
        (3, "node-a", False),
        (0, "node-b", True),
        (1, "node-b", False),
    ]
    unplaced = rank_columns((0, 1, 2), {"node-a": (1,)})
    assert [(c.rank, c.starts_host) for c in unplaced] == [(1, False), (0, True), (2, False)], "no host said: last"
    assert [c.starts_host for c in rank_columns((0, 1), {})] == [False, False], "one (unknown) host: no marks"


def test_by_host_keeps_the_order_within_a_host() -> None:
    items = [("b", 1), ("a", 2), ("", 3), ("b", 4)]
    assert by_host(items, lambda i: i[0]) == (("a", (("a", 2),)), ("b", (("b", 1), ("b", 4))), ("?", (("", 3),)))


def test_a_group_of_ranks_is_told_by_its_worst_status() -> None:
    statuses = [RankStatus("finished"), RankStatus("out of memory"), RankStatus("running"), RankStatus("failed")]
    worst = worst_status(statuses)
    assert worst is not None and worst.state == "out of memory"
    assert worst_status([RankStatus("running"), RankStatus("finished")]) == RankStatus("running")
    assert worst_status([]) is None


def _row(rank: int, host: str, allocated: int | None, state: str = "running", rss: int = 0) -> RankMemoryRow:
    return RankMemoryRow(
        rank=rank, host=host, device=f"cuda:{rank % 8}", pid=None, allocated=allocated,
        reserved=None if allocated is None else allocated + GIB, peak=allocated, limit=None,
        host_rss=rss, gpu=GpuMemory(index=rank % 8, total=80 * GIB), status=RankStatus(state),
    )  # fmt: skip


def test_one_line_per_host_sums_its_ranks_up() -> None:
    rows = tuple(_row(r, "gpu-b" if r >= 8 else "gpu-a", (10 + r) * GIB) for r in range(16))
    rows = rows[:3] + (_row(3, "gpu-a", 30 * GIB, "out of memory"),) + rows[4:]
    a, b = host_memory_rows(rows)
    assert (a.host, a.ranks, a.low, a.high) == ("gpu-a", tuple(range(8)), 10 * GIB, 30 * GIB)
    assert a.status.state == "out of memory", "the host where a rank ran out says so"
    assert (b.host, b.low, b.high, b.status.state, b.whole) == ("gpu-b", 18 * GIB, 25 * GIB, "running", 80 * GIB)
    cpu = host_memory_rows((_row(0, "laptop", None, rss=2 * GIB), _row(1, "laptop", None, rss=3 * GIB)))
    assert (cpu[0].on_allocator, cpu[0].low, cpu[0].high, cpu[0].whole) == (False, 2 * GIB, 3 * GIB, None), "CPU: RSS"


def test_the_run_list_names_the_host_or_counts_them() -> None:
    assert hosts_cell(()) == "-"
    assert hosts_cell(("node-a",)) == "node-a"
    assert hosts_cell(("a-very-long-host-name.cluster",)) == "a-very-long…"
    assert hosts_cell(("node-a", "node-b")) == "2"


def _h200(index: int, used_gib: float, util: int) -> GpuMemory:
    return GpuMemory(index=index, name="NVIDIA H200", used=int(used_gib * GIB), total=141 * GIB, util=util)


def test_other_hosts_gpus_fit_a_line_each_or_one_per_host() -> None:
    node_b = HostGpus("node-b", "run", (_h200(0, 61.2, 90), _h200(1, 78.0, 99)), {})
    assert panel_title(1, ()) == "GPUs (1)" and panel_title(0, ()) == "GPUs"
    assert panel_title(1, (node_b,)) == "GPUs (1 here · 2 on 1 other host)"
    assert panel_title(0, (node_b, replace(node_b, host="node-c"))) == "GPUs (4 on 2 hosts)"
    assert gpu_lines_fit(16, 48) and not gpu_lines_fit(17, 48) and gpu_lines_fit(8, 24) and not gpu_lines_fit(9, 24)
    assert used_span(node_b.gpus) == "61.2…78.0/141G" and util_span(node_b.gpus) == "util 90…99%"
    assert util_span((GpuMemory(index=0),)) == "", "no utilisation from NVML: nothing said"



def test_hosts_that_do_not_fit_leave_the_worst_on_screen_and_sum_up_the_rest() -> None:
    rows = tuple(_row(r, f"gpu-{r // 8:03d}", (10 + r % 8) * GIB) for r in range(64 * 8))
    rows = tuple(_row(r.rank, r.host, 79 * GIB, "out of memory") if r.rank == 500 else r for r in rows)
    hosts = fitted(host_memory_rows(rows), room=8)
    assert [h.host for h in hosts] == ["gpu-062", *(f"gpu-{h:03d}" for h in range(6)), "+57 hosts"]
    assert hosts[0].status.state == "out of memory", "rank 500's host first: a failing host is never hidden"
    rest = hosts[-1]
    assert len(rest.ranks) == 57 * 8 and (rest.low, rest.high, rest.status.state) == (10 * GIB, 17 * GIB, "running")
    assert fitted(hosts[:3], room=8) == hosts[:3], "what fits is shown as it comes (in name order)"
