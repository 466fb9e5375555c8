"""The probe's memory part on one rank: the sampler that writes its ``Memory`` events, the explainer that
says what fills its memory, and the tracker of tensors kept across steps.

``Probe`` (``session.py``) owns one and tells it of phase changes; it reads the rank's device and model
from the probe as they are at each call.  Each part runs under its own fault guard (``faults.py``): the
sampler (``memory.py``) as part ``memory``, the explainer (``memory_explain.py``) as ``split``, the
tracker (``kept.py``) as ``kept``.  A part that fails is switched off and the others go on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from shardtop.probe.allocator import MemorySnapshot, MemoryStats
from shardtop.probe.faults import Faults
from shardtop.probe.kept import KeptTracker, held_storages
from shardtop.probe.memory import MemorySampler, cuda_allocated
from shardtop.probe.memory_explain import MemoryExplainer
from shardtop.probe.snapshots import write_snapshot
from shardtop.rundir.events import Event, Memory, SnapshotMoment

T = TypeVar("T")


def memory_limit_from_env() -> int | None:
    """The cap a launcher set for this rank (``SHARDTOP_MEM_LIMIT``, in bytes); None where there is none."""
    limit = os.environ.get("SHARDTOP_MEM_LIMIT")
    return int(limit) if limit and limit.isdigit() else None


class MemoryProbe:
    """This rank's memory sampler, explainer and kept tracker, each made when first wanted."""

    def __init__(
        self,
        faults: Faults,
        write: Callable[[Event], object],
        *,
        run_dir: Path | None,
        device: Callable[[], str],
        target: Callable[[], Any],
        rank: int = 0,
    ) -> None:
        self.faults = faults
        self.write = write
        self.run_dir = run_dir
        self.rank = rank
        self.device = device
        """The device the rank is on now."""
        self.target = target
        """The model the probe read last (None before any): what an explainer made now reads."""
        self.limit = memory_limit_from_env()
        """The per-process cap the rank runs under (None: none known): every sample and OOM record says it."""
        self.forward_heap: int | None = None
        """The C allocator's bytes in use at the start of this forward (CPU ranks): read once a step."""
        self.sampler: MemorySampler | None = None
        self.explainer: MemoryExplainer | None = None
        self.kept: KeptTracker | None = None
        """Traces a step now and then for tensors kept across steps (``kept.py``)."""

    # -- the sampler -------------------------------------------------------------

    def start(self, interval: float = 0.5, *, sample_gpus: bool) -> None:
        """Sample this rank's memory in the background (and the node's GPUs where ``sample_gpus``).

        Without a thread (a tight memory cap refuses one) it samples at phase changes only.
        """
        if self.sampler is not None or not self.faults.working("memory"):
            return
        with self.faults.guard("memory"):
            self.sampler = MemorySampler(
                self.write,
                device=self.device(),
                interval=interval,
                sample_gpus=sample_gpus,
                limit=self.limit,
                detail=self._split_sample,
            )
        if self.sampler is None:
            return
        try:
            self.sampler.start()
        except Exception as e:  # noqa: BLE001 - "can't start new thread"
            self.faults.report("memory", e, then="memory is sampled at phase changes only")

    def use_device(self, device: str) -> None:
        """Sample ``device`` from now on (the engine put the rank there after sampling began)."""
        if self.sampler is not None and self.sampler.device != device:
            with self.faults.guard("memory"):
                self.sampler.use_device(device)

    def set_limit(self, limit: int | None) -> None:
        """The per-process cap the rank runs under, once it applies: every record says it."""
        self.limit = limit
        if self.sampler is not None:
            self.sampler.limit = limit

    def sample(self, fresh_rss: bool = False, heap: int | None = None) -> None:
        if self.sampler is not None and self.faults.working("memory"):
            with self.faults.guard("memory"):
                self.sampler.sample_now(fresh_rss=fresh_rss, heap=heap)

    def heap_now(self) -> int | None:
        """The C allocator's bytes in use, read now (through the sampler, which keeps it for its samples)."""
        if self.sampler is not None and self.faults.working("memory"):
            with self.faults.guard("memory"):
                return self.sampler.heap_now()
        return None

    # -- the explainer -----------------------------------------------------------

    def current_explainer(self) -> MemoryExplainer | None:
        """What fills this rank's memory (``memory_explain.py``), for the current device; None once it failed."""
        if not self.faults.working("split"):
            return None
        explainer = self.explainer
        device = self.device()
        if explainer is None or explainer.device != device:
            with self.faults.guard("split"):
                self.explainer = MemoryExplainer(
                    device,
                    run_dir=self.run_dir,
                    on_failure=lambda e: self.faults.report(
                        "split", e, then="the peak's split from the allocator's trace is left out"
                    ),
                    write_snapshot=self.write_snapshot,
                )
                if explainer is not None:
                    explainer.close()
                target = self.target()
                if target is not None:
                    self.explainer.set_target(target)
                self.explainer.census.kept = self._kept_now
        return self.explainer if self.faults.working("split") else None

    def explain(self, use: Callable[[MemoryExplainer], T]) -> T | None:
        """``use(explainer)`` under the explainer's guard: what it returns, or None where there is no explainer
        (it failed before) or ``use`` failed (it is switched off, training goes on)."""
        explainer = self.current_explainer()
        if explainer is None:
            return None
        with self.faults.guard("split"):
            return use(explainer)
        return None

    def _split_sample(self, sample: Memory, stats: MemoryStats | None, fresh: bool) -> Memory:
        """The sampler's ``detail``: ``sample`` with the split, the allocator's stats and NVML's
        figure for this process; ``sample`` as it was where the split failed."""
        explainer = self.explainer
        if explainer is not None and self.faults.working("split"):
            with self.faults.guard("split"):
                return explainer.sample(sample, stats, fresh)
        return sample

    # -- tensors kept across steps -----------------------------------------------

    def follow_kept(self, names: dict[int, str]) -> None:
        """Trace steps for tensors kept across them, once the modules have names (``names``: id -> path)."""
        if self.kept is None and self.faults.working("kept"):
            with self.faults.guard("kept"):
                self.kept = KeptTracker(names, self.reading, lambda: held_storages(self.target()))

    def _kept_now(self) -> list[tuple[int, int, int]] | None:
        """For a census: the tensors kept from earlier steps, where their modules' outputs are followed."""
        kept = self.kept
        if kept is None or not kept.following or not self.faults.working("kept"):
            return None
        return kept.kept_storages()

    def reading(self) -> int:
        """This rank's memory now: allocated on its GPU, else what the C allocator has in use (else RSS)."""
        device = self.device()
        if device.startswith("cuda"):
            import torch

            return cuda_allocated(torch, device)
        if self.forward_heap is not None:
            return self.forward_heap
        from shardtop.probe.heap import heap_in_use

        if heap_in_use is not None:
            return heap_in_use()
        import psutil

        return int(psutil.Process().memory_info().rss)

    # -- the rank's phases -------------------------------------------------------

    def write_snapshot(self, moment: SnapshotMoment, snapshot: MemorySnapshot) -> None:
        """The allocator's snapshot at ``moment``, as a file of the run and an event naming it."""
        if self.run_dir is None:
            return
        with self.faults.guard("snapshots"):
            written = write_snapshot(self.run_dir, self.rank, moment, snapshot)
            if written is not None:
                self.write(written)

    def forward_again(self, step: int) -> None:
        """Another forward began with no other phase in between: what its graph holds starts anew, and
        what the one before made is an earlier forward's."""
        self.explain(lambda explainer: explainer.on_forward_again(step))

    def at_phase(self, phase: str, step: int, graph: Any = None) -> None:
        """A new phase began: at a forward, read the heap (CPU) and check for kept tensors; tell the
        explainer; take a sample."""
        forward_on_cpu = phase == "forward" and not self.device().startswith("cuda")
        self.forward_heap = self.heap_now() if forward_on_cpu else None  # once a step: the growth check's too
        if phase == "forward" and self.kept is not None and self.faults.working("kept"):
            with self.faults.guard("kept"):
                kept = self.kept.on_forward(step)
                if kept is not None:
                    self.write(kept)
        self.explain(lambda explainer: explainer.on_phase(phase, step, graph))
        self.sample(fresh_rss=forward_on_cpu, heap=self.forward_heap)

    def stop(self) -> None:
        """Stop the sampler's thread and the explainer (the rank is ending)."""
        if self.sampler is not None:
            try:
                self.sampler.stop()
            except Exception:  # noqa: BLE001
                pass
        if self.explainer is not None:
            with self.faults.guard("split"):
                self.explainer.close()

    def close(self) -> None:
        """``stop``, and take the kept tracker's hooks off the modules."""
        self.stop()
        if self.kept is not None:
            self.kept.close()
