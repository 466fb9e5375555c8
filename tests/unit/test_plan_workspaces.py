"""cuDNN's convolution workspace in a plan: counted where the shape was measured, said where it was not.

The measured figures come from ``gpu/scenarios/conv_workspace.py`` on an H200; the plan of the
``manual-placement`` recordings against their peaks is ``test_plan_recordings.py``.
"""

from __future__ import annotations

from typing import Any

from shardtop.config import resolve
from shardtop.plan.cards import card
from shardtop.plan.render import render_text
from shardtop.plan.workspaces import BACKWARD_WORKSPACE, shape_of
from shardtop.trace.presets import describe_preset, plan_config

MiB = 1 << 20
H200 = card("H200", 143771 * MiB, "the card")


def _manual_placement(**changes: str) -> dict[str, Any]:
    """The preset as ``shardtop plan manual-placement KEY=VALUE...`` resolves it for one GPU."""
    return resolve("manual-placement", list({"devices": "1", "accelerator": "cuda", **changes}.items()))


def test_the_model_lists_each_convolution_shape_its_forward_ran() -> None:
    desc = describe_preset(_manual_placement())
    types = [c.type for c in desc.convolutions]
    assert types == ["Conv2d", "Conv2d", "ConvTranspose2d", "Conv2d"]
    patch = desc.convolutions[1]
    assert patch.input == (2, 32, 256, 256) and patch.kernel == (16, 16) and patch.stride == (16, 16)
    assert [desc.path(r) for c in desc.convolutions for r in c.rows] == [
        "conv1", "conv2", "conv_out", "out_layer"]  # fmt: skip


def test_a_measured_shape_is_counted_in_backward_and_the_note_says_where_it_was_measured() -> None:
    plan = plan_config(_manual_placement(), devices=1, accelerator="cuda", gpu=H200)
    p = plan.asked.per_rank
    desc = describe_preset(_manual_placement())
    # the patch convolution's backward, on the first device; the transposed one runs on the CPU half
    assert p.conv_workspace == BACKWARD_WORKSPACE[shape_of(desc.convolutions[1])] > 200 * MiB
    assert p.peak_phase == "backward"
    text = render_text(plan)
    assert "cuDNN's convolution workspace is counted in backward, 211 MiB at most" in text.replace("\n  ", " ")
    assert "4 of the model's 4 convolution shapes on an H200" in text.replace("\n  ", " ")


def test_a_shape_never_measured_is_counted_as_none_and_said() -> None:
    plan = plan_config(_manual_placement(batch_size="4"), devices=1, accelerator="cuda", gpu=H200)
    assert plan.asked.per_rank.conv_workspace == 0
    [note] = [n for n in plan.notes if "convolution" in n]
    assert note.startswith("4 convolution shapes without a measured workspace are counted as none")


def test_a_cpu_plan_has_no_cudnn_workspace() -> None:
    plan = plan_config(_manual_placement(accelerator="cpu"), devices=1, accelerator="cpu", gpu=None)
    assert plan.asked.per_rank.conv_workspace == 0
    assert not [n for n in plan.notes if "cuDNN" in n]
