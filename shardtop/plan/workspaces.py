"""cuDNN's convolution workspaces: what a convolution's backward takes beyond its tensors.

cuDNN picks an algorithm for each convolution shape on the GPU at run time, and
the workspace with it; nothing in the model says how large it will be.  So the
plan counts only workspaces that were measured, shape by shape
(``gpu/scenarios/conv_workspace.py``), and says which shapes it did not count.
Convolutions run one at a time, so a step holds the largest of them, in
backward.  Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shardtop.plan.description import Convolution, ModelDescription
from shardtop.units import format_bytes
from shardtop.words import noun, plural

MEASURED_ON = "an H200 (compute capability 9.0) with cuDNN 9.19 and torch 2.11, cudnn.benchmark off"

Shape = tuple[str, tuple[int, ...], int, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], int, int]

BACKWARD_WORKSPACE: dict[Shape, int] = {
    # type, input, out channels, kernel, stride, padding, dilation, groups, dtype bytes: workspace bytes
    ("Conv2d", (2, 3, 256, 256), 32, (3, 3), (1, 1), (1, 1), (1, 1), 1, 4): 1_051_648,
    ("Conv2d", (2, 32, 256, 256), 768, (16, 16), (16, 16), (0, 0), (1, 1), 1, 4): 221_246_464,
    ("ConvTranspose2d", (2, 768, 16, 16), 32, (16, 16), (16, 16), (0, 0), (1, 1), 1, 4): 221_249_408,
    ("Conv2d", (2, 32, 256, 256), 3, (1, 1), (1, 1), (0, 0), (1, 1), 1, 4): 19_964_020,
}
"""Measured on ``MEASURED_ON``: the allocator's peak during one convolution's backward (gradients of input
and weight) less what was allocated before it and the gradients it made."""


def shape_of(c: Convolution, batch_scale: float = 1.0) -> Shape:
    """The table's key for ``c`` at another batch size (``batch_scale`` times the described one)."""
    batch = max(1, round(c.input[0] * batch_scale)) if c.input else 0
    return (c.type, (batch, *c.input[1:]), c.out_channels, c.kernel, c.stride, c.padding, c.dilation, c.groups,
            c.dtype_bytes)


@dataclass(frozen=True)
class Workspace:
    """The convolution workspace a step holds in backward, and the shapes it could not count."""

    bytes: int
    counted: int
    """Convolution shapes whose workspace was measured."""
    unmeasured: int
    """Convolution shapes the plan has no measurement for: counted as none."""


def conv_workspace(convs: Iterable[Convolution], *, batch_scale: float = 1.0) -> Workspace:
    """The largest measured backward workspace among ``convs``."""
    found = [BACKWARD_WORKSPACE.get(shape_of(c, batch_scale)) for c in convs]
    measured = [w for w in found if w is not None]
    return Workspace(max(measured, default=0), len(measured), len(found) - len(measured))


def run_within(desc: ModelDescription, c: Convolution, rows: Iterable[int]) -> bool:
    """Did a module in the subtree of one of ``rows`` run ``c``?"""
    spans = [(r, desc.end[r]) for r in rows]
    return any(a <= row < b for row in c.rows for a, b in spans)


def on_rows(desc: ModelDescription, rows: Iterable[int] | None) -> tuple[Convolution, ...]:
    """The convolutions run by modules in the subtrees of ``rows`` (all of them for None)."""
    if rows is None:
        return desc.convolutions
    rows = tuple(rows)
    return tuple(c for c in desc.convolutions if run_within(desc, c, rows))


def workspace_note(convs: tuple[Convolution, ...], *, gpu: bool) -> str | None:
    """What the plan says of the workspace of ``convs`` (as run), where there are some and they run on a GPU."""
    if not gpu or not convs:
        return None
    w = conv_workspace(convs)
    shapes = len(convs)
    parts = []
    if w.counted:
        parts.append(f"cuDNN's convolution workspace is counted in backward, {format_bytes(w.bytes)} at most, "
                     f"as measured for {w.counted} of the model's {shapes} convolution shapes on {MEASURED_ON}; "
                     "another GPU or cuDNN may choose another algorithm and workspace")
    if w.unmeasured:
        parts.append(f"{plural(w.unmeasured, 'convolution shape')} without a measured workspace "
                     f"{noun(w.unmeasured, 'is', 'are')} counted as none: cuDNN chooses it on the GPU at run time "
                     "(measured up to 211 MiB for one 16 × 16 kernel)")
    return "; ".join(parts) + "."
