"""An OOM inside a forward, recorded on an H100 (``tests/fixtures/runs/h100-fit-hf``, ``shardtop fit`` of an HF
Trainer FSDP2 Llama of 1.2 B parameters, rank 0 of 8 rehearsed, micro-batch 2048 × sequence 2048, torch 2.11):
the first layer's RMSNorm asked for 32 GiB (its fp32 upcast) with 48.9 GiB allocated, 48 GiB of it ``other``
made in that forward.

What a forward still running holds is what it is making (its activations on their way, its temporaries): it
grows with the tokens of a micro-batch, and is "saved for no backward" only once the forward is over.  The
finding offers fewer tokens per micro-batch, and never says a smaller micro-batch does not reduce it.  The
snapshot the run wrote is left out of the fixture (the report still names it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardtop.read.memory_kinds import kinds_sentence, split_sentence
from shardtop.rundir.memory_figures import MemoryKinds, MemorySplit, OtherParts
from tests.support.cli import report

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "h100-fit-hf" / "20261207-073355-fit_hf_trainer-89e7"
GIB = 1 << 30


def test_an_oom_inside_a_forward_offers_fewer_tokens_per_micro_batch_for_what_the_forward_was_making() -> None:
    data: dict[str, Any] = json.loads(report(RUN, "json"))
    oom = data["oom"]
    assert (oom["phase"], oom["module"]) == ("forward", "model.layers.0.input_layernorm")
    split = oom["memory"]
    assert split["phase"] == "forward" and split["other_parts"]["forward"] > 0.9 * split["by_kind"]["other"]
    (finding,) = [f for f in data["findings"] if f["code"] == "oom"]
    fix = finding["fix"]
    assert "fewer tokens per micro-batch" in fix and "made by the forward running then" in fix, fix
    assert "do not reduce" not in fix and "micro-batch do" not in fix, fix
    assert "saved for no backward" not in finding["detail"] and "the running forward's tensors" in finding["detail"]


def test_the_report_never_says_a_running_forwards_tensors_were_saved_for_no_backward() -> None:
    text = report(RUN, "text")
    assert "saved for no backward" not in text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("Rank 0: other:")]
    assert "48 GiB made by the forward running then" in line and "modeling_llama.py:64" in line, line
    assert "the running forward's tensors" in text


def test_the_forward_part_is_saved_for_no_backward_only_once_the_forward_is_over() -> None:
    def split(phase: str) -> MemorySplit:
        return MemorySplit(allocated=10 * GIB, by_kind=MemoryKinds(other=9 * GIB, params=GIB), unexplained=0,
                           phase=phase, other_parts=OtherParts(forward=9 * GIB))

    assert "the running forward's tensors" in split_sentence(split("forward"))
    assert "saved for no backward" in split_sentence(split("backward"))
    assert "saved for no backward" in kinds_sentence(10 * GIB, {"other": 9 * GIB}, 0, other_parts={"forward": 9 * GIB})
