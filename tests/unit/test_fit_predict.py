"""A plan that traced no forward gives fit no batch: it is never the search's ceiling, never ranked first, and
the search starts at the batch as given and doubles up.

A description without activations is what a command's plan holds where the script stopped (or the trace
failed) before its model's first forward: every row saved nothing, batch size 0.  Under a limit far above
its peak, the old plan put such a set-up at the search's ceiling (65536) and the search halved down from
there, each rehearsal out of memory."""

from __future__ import annotations

from pathlib import Path

from shardtop.fit.command import Target, no_forward_lines, order
from shardtop.fit.configuration import Configuration
from shardtop.fit.predict import TracedPlan, no_forward_words, predict, predictions
from shardtop.fit.search import MAX_BATCH, BoundarySearch, Probe
from shardtop.fit.stacks import CommandStack
from shardtop.plan.cards import parse_gpu
from shardtop.plan.description import ModelDescription
from shardtop.plan.script import ScriptPlan
from shardtop.plan.strategies import Strategy

GiB = 1 << 30
NOTE = "the command ended after handing its model to fully_shard, before calling it"
PARAMS = 100_000_000
"""Elements of the one Linear: 400 MB in fp32, a few GB with AdamW's state and gradients."""


def description(saved: int = 0, batch: int = 0) -> ModelDescription:
    """One Linear of ``PARAMS`` elements; ``saved``: the floating-point elements its forward saved for a
    batch of ``batch`` (0, 0: no forward traced)."""
    return ModelDescription(
        name="Linear", names=[""], parents=[-1], end=[1], types=["Linear"], numel_upto=[0, PARAMS],
        small_upto=[0, 0], small_threshold=1024, largest_param=PARAMS, dtype_bytes=4, buffer_bytes=0,
        repeated_blocks=[], saved_float_upto=[0, saved], saved_other_upto=[0, 0], largest_output=saved,
        input_bytes=4 * saved, batch_size=batch,
    )


GPU = parse_gpu("A100-80GB")
GIVEN = Configuration(as_given=True)
CKPT = Configuration(as_given=False, checkpointing=True)


def test_a_plan_without_activations_gives_no_batch_not_the_ceiling() -> None:
    p = predict(GIVEN, description(), Strategy(engine="ddp"), devices=8, on_gpu=True, gpu=GPU, no_forward=NOTE)
    assert p.peak_at_one < GPU.usable
    assert p.largest_batch is None and p.largest_batch != MAX_BATCH and p.peak_at_largest is None
    assert p.no_guess.startswith("the plan traced no forward: activations not planned") and NOTE in p.no_guess


def test_nothing_growing_gives_no_batch_even_without_the_plans_note() -> None:
    p = predict(GIVEN, description(), Strategy(engine="ddp"), devices=8, on_gpu=True, gpu=GPU)
    assert p.largest_batch is None and p.slope is None and "grows with the batch" in p.no_guess


def test_a_plan_with_activations_still_gives_its_batch() -> None:
    p = predict(GIVEN, description(saved=4 * 50_000_000, batch=4), Strategy(engine="ddp"), devices=8,
                on_gpu=True, gpu=GPU)
    assert p.no_guess == "" and p.largest_batch is not None and 4 < p.largest_batch < MAX_BATCH


def test_a_plan_whose_one_sample_does_not_fit_still_says_none() -> None:
    small = parse_gpu("1GiB")
    p = predict(GIVEN, description(), Strategy(engine="ddp"), devices=8, on_gpu=True, gpu=small, no_forward=NOTE)
    assert p.largest_batch is None and p.no_guess == ""


def test_set_ups_without_a_guess_rank_after_one_with_a_guess_and_search_from_the_given_batch(tmp_path: Path) -> None:
    stack = CommandStack.of(["python", "train.py", "--per_device_train_batch_size", "4"], tmp_path)
    assert stack.given_batch == 4
    blind = TracedPlan(description(), Strategy(engine="ddp"), "cuda", no_forward=NOTE)
    seen = TracedPlan(description(saved=4 * 50_000_000, batch=4), Strategy(engine="ddp"), "cuda")
    found = predictions({None: blind, True: seen}, [Configuration(as_given=True, checkpointing=None), CKPT],
                        devices=8, gpu=GPU)
    assert [p.configuration for p in order(found)] == [CKPT, found[0].configuration]
    target = Target(title="t", stack=stack, knobs=(), predictions=tuple(found), searchable=True,
                    given_batch=stack.given_batch)
    assert target.first_batch(found[0]) == 4
    assert target.first_batch(found[1]) == found[1].largest_batch

    # the search from there doubles while batches fit, then follows what was measured
    search = BoundarySearch(start=target.first_batch(found[0]), limit=70 * GiB, plan_slope=found[0].slope)
    rehearsed = []
    while (batch := search.next_batch()) is not None and len(rehearsed) < 30:
        rehearsed.append(batch)
        peak = 5 * GiB + batch * GiB // 2
        fits = peak <= search.limit
        search = search.after(Probe(batch, "fits" if fits else "out of memory", peak if fits else None))
    assert rehearsed[:2] == [4, 8] and MAX_BATCH not in rehearsed
    assert search.found and search.fitting is not None and search.fitting.batch == 130


def _script_plan(notes: list[str], complete: bool, not_traced: str = "") -> ScriptPlan:
    return ScriptPlan(description=description(), strategy=Strategy(engine="fsdp2"), devices=8, accelerator="cuda",
                      entry="fully_shard", notes=notes, complete=complete, not_traced=not_traced)


def test_what_the_plan_said_where_it_traced_no_forward() -> None:
    assert no_forward_words(_script_plan(["assumed AdamW"], complete=False, not_traced=NOTE)) == NOTE
    assert no_forward_words(_script_plan([], complete=False)) == "the plan was written before the model was called"
    traced = "activations traced on the meta device through the model, at the shapes of the batch"
    assert no_forward_words(_script_plan([traced], complete=True)) == ""


def test_progress_says_once_what_the_plans_said() -> None:
    blind = TracedPlan(description(), Strategy(engine="ddp"), "cuda", no_forward=NOTE)
    seen = TracedPlan(description(saved=4, batch=4), Strategy(engine="ddp"), "cuda")
    lines = no_forward_lines([blind, blind, seen], 4)
    assert len(lines) == 1 and NOTE in lines[0] and "starts at the command's own micro-batch (4)" in lines[0]
    assert no_forward_lines([seen], 4) == []
