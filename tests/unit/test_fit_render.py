"""What ``shardtop fit`` prints: each set-up's plan beside what its rehearsals measured, the pick and how to run
it, every rehearsal named as the run it is; the JSON holds the same and every key ``docs/fit-json.md`` lists."""

from __future__ import annotations

import dataclasses
import json
import re

from shardtop.fit.configuration import Configuration, Knob
from shardtop.fit.measure import RankMeasure, Trial
from shardtop.fit.predict import PlannedOnly, Prediction
from shardtop.fit.render import render_json, render_text
from shardtop.fit.result import FitResult, SetupResult, Use
from shardtop.rundir.memory_figures import MemoryKinds, MemorySplit
from tests.support.cli import ROOT

MiB = 1 << 20
LIMIT = 64 * MiB
AT_OOM = MemorySplit(by_kind=MemoryKinds(params=MiB, optimizer=MiB, activations=40 * MiB), phase="backward")


def trial(batch: int, fits: bool, peak: int | None, run: str) -> Trial:
    ranks = tuple(
        RankMeasure(rank=r, state="finished" if fits else "out of memory", detail="", peak=peak, steps=2 if fits else 1,
                    step_seconds=0.25 + r / 10 if fits else None, fills=None if fits else AT_OOM,
                    oom_phase=None if fits else "backward")
        for r in (0, 1)
    )
    return Trial(batch, "fits" if fits else "out of memory", ranks, run, f"/runs/{run}", 7.0)


def setups() -> tuple[SetupResult, ...]:
    given = Configuration(zero_stage=3, checkpointing=False, given="ZeRO-3, fp32")
    ckpt = given.but(checkpointing=True, given="")
    offload = given.but(zero_stage=3, offload_optimizer=True, offload_params=True, given="")
    return (
        SetupResult(Prediction(ckpt, "ZeRO-3, fp32", 30, 10 * MiB, 60 * MiB, MiB), (
            trial(30, False, None, "r1"), trial(15, True, 40 * MiB, "r2"), trial(24, True, 58 * MiB, "r3"),
            trial(25, False, None, "r4")), "found"),
        SetupResult(Prediction(given, "ZeRO-3, fp32", 12, 12 * MiB, 60 * MiB, 4 * MiB), (
            trial(12, True, 60 * MiB, "r5"), trial(13, False, None, "r6")), "found"),
        SetupResult(Prediction(offload, "ZeRO-3, fp32, param + optimizer offload", None, 90 * MiB, None, MiB), (),
                    "ruled out", note="the plan needs 90 MiB at one sample"),
    )


def result() -> FitResult:
    knobs = (Knob("micro-batch", True, "--per_device_train_batch_size"),
             Knob("sharding", False, "no DeepSpeed config on the line"))
    return FitResult(title="torchrun train.py", devices=8, gpu="64 MiB", limit=LIMIT, on="CPU", knobs=knobs,
                     setups=setups(), seconds=61.0, budget_s=600.0,
                     planned_only=(PlannedOnly("ZeRO-3, fp32, optimizer offload", 40),),
                     use=Use("torchrun train.py --per_device_train_batch_size 24 --gradient_checkpointing true",
                             ("--per_device_train_batch_size 24", "--gradient_checkpointing true")))


def test_the_pick_is_the_largest_batch_then_the_least_offload() -> None:
    pick = result().pick
    assert pick is not None and pick.configuration.checkpointing and pick.largest is not None
    assert pick.largest.batch == 24
    tie = (setups()[1], SetupResult(setups()[1].prediction, setups()[1].trials, "found"))
    offloaded = SetupResult(Prediction(setups()[2].configuration, "", 12, 0, None, None), setups()[1].trials, "found")
    with_offload = FitResult(title="t", devices=2, gpu="g", limit=LIMIT, on="CPU", knobs=(),
                             setups=(offloaded, *tie), seconds=1.0, budget_s=2.0)
    assert with_offload.pick is not None and with_offload.pick.configuration.offload_level == 0


def test_the_table_says_each_set_up_its_boundary_and_the_pick() -> None:
    text = render_text(result())
    rows = {line.split("  ")[0]: line for line in text.splitlines()}
    ckpt = rows["ZeRO-3, activation checkpointing"]
    assert re.search(r"\b30\s+24\s+25\s+58 MiB \(90\.6 %\)\s+0\.35 s\s+4$", ckpt), ckpt
    assert re.search(r"\b12\s+12\s+13\s+60 MiB \(93\.8 %\)", rows["as given (ZeRO-3, fp32, no activation "
                                                                  "checkpointing)"])
    assert "not rehearsed, the plan rules it out (the plan needs 90 MiB at one sample)" in text
    assert "what fills it: 42 MiB in tensors: 40 MiB activations" in text
    assert "collectives not run" in text and "one rehearsed rank's" in text
    assert "Pick: ZeRO-3, activation checkpointing, micro-batch 24" in text
    assert "  run:    torchrun train.py --per_device_train_batch_size 24 --gradient_checkpointing true" in text
    assert all(f"  r{n}" in text for n in range(1, 7)), "every rehearsal is named as its run"
    assert "not exposed: no DeepSpeed config on the line" in text
    assert "Planned only (no knob of the stack sets them; never rehearsed):\n  ZeRO-3, fp32, optimizer offload: " \
           "micro-batch 40" in text


def test_a_search_the_budget_cut_short_says_at_least() -> None:
    cut = SetupResult(setups()[0].prediction, setups()[0].trials[1:3], "budget", note="the budget was spent")
    text = render_text(FitResult(title="t", devices=2, gpu="g", limit=LIMIT, on="CPU", knobs=(), setups=(cut,),
                                 seconds=1.0, budget_s=2.0, use=Use("t", ())))
    assert "micro-batch ≥ 24" in text and "stopped before its boundary (the budget was spent)" in text


def test_the_json_holds_what_the_table_says_and_what_its_page_lists() -> None:
    data = json.loads(render_json(result()))
    first = data["configurations"][0]
    assert (first["largest_batch"], first["first_out_of_memory"], first["boundary_proven"]) == (24, 25, True)
    assert first["plan"]["largest_batch"] == 30 and first["fills"]["at"] == "oom" and first["fills"]["batch"] == 25
    assert [t["batch"] for t in first["trials"]] == [30, 15, 24, 25]
    assert data["pick"]["batch"] == 24 and data["rehearsals"] == 6
    assert data["planned_only"] == [{"strategy": "ZeRO-3, fp32, optimizer offload", "largest_batch": 40}]
    assert data["configurations"][2]["ending"] == "ruled out" and data["configurations"][2]["trials"] == []
    page = (ROOT / "docs" / "fit-json.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", page, flags=re.MULTILINE))
    keys = set(data) | set(first) | set(first["plan"]) | set(first["trials"][0]) | set(first["trials"][0]["ranks"][0])
    keys |= set(first["fills"]) | set(data["pick"]) | set(data["knobs"][0])
    assert keys - documented == set(), "every key is on docs/fit-json.md"


def test_a_command_whose_batch_no_knob_changes_is_tried_at_its_own() -> None:
    own = SetupResult(setups()[1].prediction, (trial(0, True, 50 * MiB, "r7"),), "found")
    text = render_text(FitResult(title="t", devices=2, gpu="g", limit=LIMIT, on="CPU", knobs=(), setups=(own,),
                                 seconds=1.0, budget_s=2.0, use=Use("t", ())))
    assert "micro-batch its own, peak 50 MiB (78.1 %)" in text


def test_a_set_up_the_plan_gives_no_batch_says_so_and_why() -> None:
    no_guess = "the plan traced no forward: activations not planned (no forward pass was traced)"
    blind = SetupResult(Prediction(setups()[1].configuration, "ZeRO-3, fp32", None, 12 * MiB, None, None,
                                   no_guess=no_guess), (trial(4, True, 20 * MiB, "r8"),), "budget")
    res = FitResult(title="t", devices=2, gpu="g", limit=LIMIT, on="CPU", knobs=(), setups=(blind,), seconds=1.0,
                    budget_s=2.0)
    text = render_text(res)
    row = next(line for line in text.splitlines() if line.startswith("as given"))
    assert row.split(")")[1].split()[0] == "-", row
    assert f"planned -: {no_guess}; the search starts at the micro-batch as given and doubles" in text
    plan = json.loads(render_json(res))["configurations"][0]["plan"]
    assert plan["largest_batch"] is None and plan["no_guess"] == no_guess


def test_what_the_offload_held_in_host_memory_is_said_beside_what_filled_the_gpu() -> None:
    """A set-up that offloads: the rehearsed rank's peak and split are the GPU's; what its engine held in host
    memory is said beside them, in the text and the JSON."""
    moved = tuple(dataclasses.replace(r, offloaded=24 * MiB) for r in trial(25, False, None, "r7").ranks)
    offloaded = setups()[2].configuration.but(given="")
    found = SetupResult(Prediction(offloaded, "ZeRO-3, fp32, param + optimizer offload", 30, MiB, 60 * MiB, MiB),
                        (trial(24, True, 40 * MiB, "r6"), Trial(25, "out of memory", moved, "r7", "/runs/r7", 7.0)),
                        "found")
    fit = FitResult(title="t", devices=2, gpu="g", limit=LIMIT, on="CPU", knobs=(), setups=(found,), seconds=1.0,
                    budget_s=2.0)
    assert "at its out-of-memory error); 24 MiB more offloaded to host memory, outside the peak" in render_text(fit)
    ranks = json.loads(render_json(fit))["configurations"][0]["trials"][1]["ranks"]
    assert [r["offloaded_bytes"] for r in ranks] == [24 * MiB, 24 * MiB]
