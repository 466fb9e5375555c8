"""The Log tab: a warning every rank prints every step is one line with a count, said whole."""

from __future__ import annotations

from pathlib import Path

from shardtop.tui.log_fold import FoldedLog
from shardtop.tui.watch.log_tail import LogLine
from shardtop.tui.widgets.log_pane import LogPane
from tests.support.apps import run_app, run_ready
from tests.support.first_minutes import FIRST_LAUNCH, copy_first_minutes
from tests.support.waiting import settled

ALL_GATHER = (
    "`torch.distributed.all_gather_into_tensor` is deprecated. Please use `torch.distributed.all_gather_single` "
    "instead."
)


async def all_lines(pilot: object, pane: LogPane) -> list[str]:
    """Every line the pane has, as the user reads them scrolling down."""
    lines: dict[int, str] = {}
    for top in range(0, pane.virtual_size.height, pane.size.height):
        pane.scroll_to(y=top, animate=False, immediate=True)
        await settled(pilot)
        at = round(pane.scroll_y)
        for y in range(min(pane.size.height, pane.virtual_size.height - at)):
            lines[at + y] = pane.render_line(y).text.rstrip()
    return [lines[i] for i in sorted(lines)]


async def test_a_repeated_torch_warning_is_one_line_with_its_count_and_its_whole_message(in_tmp: Path) -> None:
    """The first launch on CPU: each rank printed torch's two FutureWarnings five times, with the source line
    under each (20 lines): two entries, counted, from both ranks, their messages not cut at 80×24."""
    run = copy_first_minutes(in_tmp / "runs", FIRST_LAUNCH)
    app = run_app(in_tmp / "runs", run)
    async with app.run_test(size=(80, 24)) as pilot:
        await run_ready("l")(pilot)
        pane = app.screen.query_one(LogPane)
        lines = await all_lines(pilot, pane)
    text = "".join("".join(line.split("│", 1)[-1].split()) for line in lines)  # wrapped anywhere: spaces left out

    def said(words: str) -> int:
        return text.count("".join(words.split()))

    assert sum("FutureWarning" in line for line in lines) == 2, "one line per distinct warning"
    assert "r0,r1 │ ⚠ FutureWarning ×6:" in "\n".join(lines), "who printed it, and how often"
    assert said(ALL_GATHER + " (torch/distributed/c10d_logger.py:83)") == 1, "the message whole, then where"
    assert not said("return func(*args, **kwargs)"), "the source line under each warning is not repeated"
    assert said("started 2 ranks") == 1 and said("deepspeed_shm_comm_op built successfully") == 2


def test_a_warnings_source_line_read_in_a_later_poll_is_still_its_own() -> None:
    log = FoldedLog()
    warning = "/x/site-packages/torch/a.py:7: UserWarning: careful"
    assert log.add([LogLine("r0", warning)]) == {0}
    assert log.add([LogLine("r0", "  warnings.warn(...)"), LogLine("r0", "step 1")]) == {1}
    assert log.add([LogLine("r1", warning), LogLine("r1", "  warnings.warn(...)")]) == {0}
    assert [e.words for e in log.entries] == ["UserWarning ×2: careful (torch/a.py:7)", "step 1"]
    assert log.entries[0].label == "r0,r1"
