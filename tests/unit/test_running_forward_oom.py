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

import msgspec

from shardtop.read.memory_kinds import kinds_sentence, split_sentence
from shardtop.read.other_parts import running_forward
from shardtop.rundir.events import Oom
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


def test_the_forward_part_is_the_running_forwards_only_at_an_oom_raised_inside_a_modules_forward() -> None:
    """The phase stays ``forward`` while the loss is computed after the model returned (the 256k vocabulary's
    OOM, in ``tests/fixtures/runs/h100-oom-stories``: its forward part is the logits the head returned); only
    the modules on the OOM's stack tell a forward still running."""
    split = MemorySplit(allocated=10 * GIB, by_kind=MemoryKinds(other=9 * GIB, params=GIB), unexplained=0,
                        phase="forward", step=1, other_parts=OtherParts(forward=9 * GIB))
    inside = Oom(rank=0, t=0.0, phase="forward", step=1, module="net.0", attributed_by="forward-frame",
                 module_stack=["", "net", "net.0"], allocated=10 * GIB)
    after = Oom(rank=0, t=0.0, phase="forward", step=1, allocated=10 * GIB)
    assert running_forward(split, inside) and not running_forward(split, after)
    assert not running_forward(msgspec.structs.replace(split, allocated=9 * GIB), inside)  # not the OOM's moment
    assert "the running forward's tensors" in split_sentence(split, running=True)
    assert "saved for no backward" in split_sentence(split)
    assert "saved for no backward" in kinds_sentence(10 * GIB, {"other": 9 * GIB}, 0, other_parts={"forward": 9 * GIB})
