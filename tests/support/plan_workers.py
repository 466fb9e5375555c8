"""Rank function for test_plan_presets.py: gradient bytes of the raw-engine presets, measured.

The probe's snapshots of raw loops come after ``optimizer.step()`` and
``zero_grad(set_to_none=True)``, so they carry no gradients, and ZeRO-3's
gradient partitions live in DeepSpeed's own buffer.  Here each preset's real
program runs (``load_program``) with the loop replaced by one forward and one
backward, and the gradients are read off what the program handed the probe:
the FSDP1 wrapper's ``param.grad``, or the ZeRO-3 optimizer's
``grad_partitions_flat_buffer``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def raw_preset_grads(rank: int, world_size: int, out_dir: Path, presets: list[list[str]]) -> dict[str, int]:
    """``{preset: gradient bytes on this rank}`` after one backward of each ``[preset, *overrides]``."""
    import shardtop.probe as st
    from shardtop.config import resolve, split_overrides
    from shardtop.launch import resolve_devices
    from shardtop.rundir.run_directory import RUN_DIR_ENV
    from shardtop.runner import raw_run
    from shardtop.runner.context import RankContext
    from shardtop.runner.programs import load_program

    attached: list[Any] = []
    original_attach = st.attach

    def spy(target: Any, **kwargs: Any) -> Any:
        attached.append(target)
        return original_attach(target, **kwargs)

    measured: dict[str, int] = {}

    def one_backward(ctx: Any, batches: Any, forward_loss: Any, backward: Any, *rest: Any) -> None:
        batch = next(iter(batches))
        backward(forward_loss(batch))
        measured[ctx.config["preset"]] = _grad_bytes(attached[-1])

    st.attach = spy  # type: ignore[assignment]
    raw_run.train = one_backward  # type: ignore[assignment]
    for words in presets:
        preset, overrides = split_overrides(words)
        config = resolve_devices(resolve(preset, [*overrides, ("accelerator", "cpu"), ("devices", str(world_size))]),
                                 lambda: 0)
        run_dir = out_dir / preset
        os.environ[RUN_DIR_ENV] = str(run_dir)
        ctx = RankContext(run_dir=run_dir, rank=rank, world_size=world_size, accelerator="cpu", config=config)
        attached.clear()
        load_program(config["program"])(ctx)
    return measured


def _grad_bytes(target: Any) -> int:
    optimizer = getattr(target, "optimizer", None)
    flat = getattr(optimizer, "grad_partitions_flat_buffer", None)
    if flat is not None:
        return flat.numel() * flat.element_size()
    return sum(p.grad.numel() * p.grad.element_size() for p in target.parameters() if p.grad is not None)
