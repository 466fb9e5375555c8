"""Memory explained: what fills a rank's memory, by kind, live, at its peak and at an OOM.

Two costs, two schedules:

* **At phase changes** (the training thread): a census of the tensors and
  engine buffers the rank holds (``memory_kinds.py``, about 1 µs per tensor),
  run only as often as ``CENSUS_BUDGET`` of wall time allows, so a model of
  100 000 tensors is split every minute or two instead of slowing its steps.
  It runs on the training thread, between the steps' own work, because
  reading tensors from another thread is not safe: ``param.grad`` read while
  ``zero_grad`` sets it to None crashed the process (a segmentation fault in
  torch 2.13).  The sampler thread reads only the allocator and NVML.
* **Explained steps** (the first ``explain_steps`` steps, a request, or a peak
  that moved past the explained one): activations are followed as they are
  saved (``activations.py``), a census is taken at each phase boundary, and
  on CUDA the allocator records every block with its stack from set-up on
  (``allocator.py``); when the steps end, the trace's peak is split block by
  block (``allocator_trace.py``) and recording stops.  Per-module activation
  bytes and gradients before the first optimizer step come from these steps.

The options and the request a reader makes are in ``memory_options.py``.
The probe runs every call under its fault guard (part ``split``): one
that fails is reported once and the split is switched off while training
goes on.  Only the trace's background split catches its own errors.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import torch

from shardtop.probe.activations import SavedActivations
from shardtop.probe.allocator import (
    AllocatorHistory,
    MemorySnapshot,
    MemoryStats,
    ProcessMemory,
    allocator_stats,
    library_workspaces,
    memory_snapshot,
)
from shardtop.probe.allocator_timeline import largest_free_block
from shardtop.probe.allocator_trace import current_split, traced_splits
from shardtop.probe.memory_kinds import KindCount, MemoryCensus
from shardtop.probe.memory_options import REQUEST_FILE, MemoryOptions
from shardtop.probe.oom import model_being_built, stack_of
from shardtop.probe.oom_event import kept_holder, objects_on_stack, stack_tensors, tensors_on_stack
from shardtop.probe.split_figures import better_peak, split_of_moment, unexplained, with_lasting_workspaces
from shardtop.rundir.events import Memory, Oom, Shards, SnapshotMoment, Tree
from shardtop.rundir.memory_figures import AllocatorStats, MemorySplit

__all__ = ["CENSUS_BUDGET", "REQUEST_FILE", "MemoryExplainer", "MemoryOptions"]

CENSUS_BUDGET = 0.005
"""At most this share of wall time goes to censuses outside explained steps."""
PEAK_MOVED = 1.05
"""A peak this much above the explained one has the next steps explained again..."""
MAX_REEXPLAINS = 2
"""...at most this many times."""


class MemoryExplainer:
    """One rank's memory split: censuses, explained steps, the peak, the OOM."""

    def __init__(
        self,
        device: str,
        options: MemoryOptions | None = None,
        run_dir: Path | None = None,
        on_failure: Callable[[BaseException], object] | None = None,
        write_snapshot: Callable[[SnapshotMoment, MemorySnapshot], object] | None = None,
    ) -> None:
        self.options = options or MemoryOptions.from_env()
        self.device = device
        self.census = MemoryCensus(device)
        self.cuda = self.census.device.type == "cuda"
        self.cuda_index = self.census.device.index or 0
        self.activations = SavedActivations()
        self.history = AllocatorHistory(self.cuda_index, self.options.trace_entries) if self.cuda else None
        self.process = ProcessMemory(self.cuda_index) if self.cuda else None
        self.request = run_dir / REQUEST_FILE if run_dir is not None else None
        self._steps_left = max(0, self.options.explain_steps)
        """The first steps still to explain (0 once their window opened)."""
        self._explaining = False
        self._window_target = 0
        self._window_steps = 0
        self._window_forwards = 0
        self._requested = False
        self._reexplains = 0
        self._labels: list[tuple[str, int]] = []
        self._censuses: list[dict[int, str]] = []
        self._target: Any = None
        self._pending: MemorySplit | None = None
        """A split taken on the training thread, for its next sample."""
        self.act_by_module: dict[int, int] | None = None
        """Bytes each module's own forward saved (module id -> bytes), from the last explained forward."""
        self.grads_before_step: tuple[list[str], list[int], list[int]] | None = None
        """(tree names, parents, grad bytes per row) read just before the first explained optimizer step."""
        self.peak_split: MemorySplit | None = None
        self._peak_dirty = False
        self._trace_peak: int | None = None
        self._census_due = 0.0
        self._lock = threading.Lock()
        self.failures = 0
        """Splits of a trace that failed on the background thread (which no fault guard covers)."""
        self.on_failure = on_failure
        """Told the error of such a failure (the probe writes it as a fault)."""
        self.write_snapshot = write_snapshot
        """Given the allocator's snapshot at an OOM and after the explained steps (the probe writes it)."""
        self._workspaces: frozenset[int] | None = None
        self.workspace_alive = 0
        """The libraries' workspaces alive when the last explained window closed (its trace names them)."""
        self.trace_seconds: tuple[float, float] | None = None
        """(snapshot, split) seconds of the last trace read: the explained steps' one-off cost."""

    # -- set-up ---------------------------------------------------------------------------

    @property
    def workspaces(self) -> frozenset[int]:
        """The libraries' workspace block sizes (read once CUDA is up: they depend on the GPU)."""
        if self._workspaces is None and self.cuda:
            found = library_workspaces(self.cuda_index)
            if found:
                self._workspaces = found
        return self._workspaces or frozenset()

    def start(self) -> None:
        """At hello: on CUDA, record the allocator from here, so a set-up OOM is explained too."""
        if self.history is not None and self.options.trace and self._steps_left:
            self.history.start()

    def set_target(self, target: Any, optimizer: Any = None) -> None:
        self._target = target
        self.census.set_target(target, optimizer)

    def on_snapshot(self, stage: str, step: int) -> None:
        """A shard snapshot was taken: a census at this point of the set-up, tied to the trace."""
        if self.history is not None and self.history.ours:
            self._mark(stage, step)

    # -- the training thread's phases --------------------------------------------------------

    def on_phase(self, phase: str, step: int, graph: Any = None) -> None:
        """``graph``: a tensor whose autograd graph the censuses of this phase change read (the loss)."""
        if graph is not None and self._follows():
            self.activations.roots = [graph]
        try:
            if phase == "forward":
                self._forward(step)
            elif self._explaining or self.activations.active:
                self._boundary(phase, step)
            if self._pending is None:
                self._census_when_due(phase, step, force=phase == "teardown")
        finally:
            self.activations.roots = []

    def _follows(self) -> bool:
        """Are activations followed now, so that a census can count them?"""
        return self._explaining or self.options.always

    def _forward(self, step: int) -> None:
        self.activations.note_forward()
        if self._explaining and self._window_forwards >= self._window_target:
            self._close_window()  # a loop that reports no steps: its forwards count them
        if not self._explaining and (self._requested or self._steps_left > 0):
            self._open_window()
        if self._explaining:
            self._window_forwards += 1
            if self.history is not None and self.history.ours:
                self._mark("forward", step)
        if self._follows():
            self.activations.start()

    def on_forward_again(self, step: int) -> None:
        """Another forward with no other phase in between (an evaluation loop, generation): a marker with no
        census ties its start to the trace, so that what an earlier forward made and something still holds
        is told from this forward's work."""
        self.activations.note_forward()
        if self.activations.failed is not None:  # a forward's saved tensors are not told from what it made
            return
        if self._explaining and self.history is not None and self.history.ours and self.history.mark():
            self._labels.append(("forward", step))
            self._censuses.append({})

    def _boundary(self, phase: str, step: int) -> None:
        count = self._end_of_forward() if self.activations.active else None
        if not self._explaining:
            return
        self._mark(phase, step, count)
        if phase == "optimizer" and self.grads_before_step is None:
            self._read_grads_before_step()

    def on_step(self, step: int) -> bool:
        """A step ended; True if a split was taken for a sample to carry now."""
        count = self._end_of_forward() if self.activations.active else None
        if not self._explaining:
            return False
        self._mark("step", step, count)
        self._window_steps += 1
        if self._window_steps >= self._window_target:
            self._close_window()
        return self._pending is not None

    def _open_window(self) -> None:
        self._window_target = self._steps_left if self._steps_left > 0 else max(1, self.options.explain_steps)
        self._steps_left = 0
        self._requested = False
        self._window_steps = self._window_forwards = 0
        self._explaining = True
        self._labels, self._censuses = [], []
        if self.history is not None and self.options.trace:
            self.history.start()

    def _end_of_forward(self) -> KindCount | None:
        """Forward is over: what each module saved is all there; stop the hooks (they cost per tensor).

        Returns the census taken to tell saved tensors from parameters, for the phase's split.
        """
        self.activations.stop()
        if not self._explaining:  # followed in every step (``always``): the split is taken when due
            return None
        count = self.census.count(self.activations)
        skip = [a for a, kind in count.addresses.items() if kind != "activations"] if count is not None else []
        found = self.activations.last if count is not None else None  # what that census read
        self.act_by_module = self.activations.by_module(self.census.device, skip, found)
        return count

    def _mark(self, phase: str, step: int, count: KindCount | None = None) -> None:
        """A census now (or the one just taken), as the next training-thread sample's split, and a
        marker tying it to the trace."""
        if count is None:
            count = self.census.count(self.activations if self._follows() else None)
        if count is None:
            return
        self._split_census(count, phase, step)
        if self.history is not None and self.history.mark():
            self._labels.append((phase, step))
            self._censuses.append(count.addresses)

    def _read_grads_before_step(self) -> None:
        from shardtop.probe.shards import read_shards

        if self._target is None:
            return
        try:
            tree, shards = read_shards(self._target, tree_id=0, stage="step", optimizer=None)
        except Exception:  # noqa: BLE001 - the shard reader's own failure, which its snapshot reports
            return
        if shards.grad_bytes is not None:
            self.grads_before_step = (list(tree.names), list(tree.parents), list(shards.grad_bytes))

    def _close_window(self) -> None:
        self._explaining = False
        if not self.options.always:
            self.activations.stop()
        history = self.history
        if history is None or not history.recording:
            return
        started = time.perf_counter()
        snapshot = history.snapshot()  # before stopping: stopping clears the trace
        history.stop()
        if snapshot is None:
            return
        censuses, labels = self._censuses, self._labels
        _ = self.workspaces  # read here, on the training thread, for the thread that splits the trace
        taken = time.perf_counter() - started
        thread = threading.Thread(target=self._split_trace, args=(snapshot, censuses, labels, taken),
                                  name="shardtop-memory-trace", daemon=True)
        thread.start()

    def _split_trace(
        self, snapshot: MemorySnapshot, censuses: list[dict[int, str]], labels: list[tuple[str, int]], taken: float
    ) -> None:
        started = time.perf_counter()
        try:
            found = traced_splits(snapshot, self.cuda_index, censuses, labels, self.workspaces)
        except Exception as e:  # noqa: BLE001 - told as a fault; the censuses' splits remain
            self.failures += 1
            if self.on_failure is not None:
                self.on_failure(e)
            return
        self.trace_seconds = (taken, time.perf_counter() - started)
        if self.write_snapshot is not None:  # written here, off the training thread: a trace takes seconds to pickle
            self.write_snapshot("peak", snapshot)
        if found is not None:
            self.workspace_alive = found.at_end.kinds.get("workspace", 0)
            self._trace_peak = found.peak.allocated
            self._offer_peak(found.peak, trace=True)

    def _offer_peak(self, split: MemorySplit, trace: bool = False) -> None:
        """Keep the split of the peak: a higher one replaces it, but within ``PEAK_SAME`` of it the better
        explained one stays (a census outside the explained steps measures no activations); a trace's
        split wins a tie (it is the true peak)."""
        if split.allocated is None:
            return
        with self._lock:
            best = self.peak_split
            if best is None or best.allocated is None or better_peak(split, best, trace):
                self.peak_split = split
                self._peak_dirty = True

    # -- samples ---------------------------------------------------------------------------

    def sample(self, sample: Memory, stats: MemoryStats | None, fresh: bool) -> Memory:
        """``sample`` with the allocator's stats, NVML's figure and the peak's split added.

        ``fresh``: the sampler thread (allocator, NVML, requests only); else the training thread,
        whose sample also carries the split its phase change took.
        """
        key = allocator_stats(stats) if stats else None
        process_used, split, peak = sample.process_used, sample.split, sample.peak_split
        if fresh:
            if self.process is not None:
                process_used = self.process.used()
            self._check_request(key)
        else:
            split, self._pending = self._pending, None
        with self._lock:
            if self._peak_dirty and self.peak_split is not None:
                peak = self.peak_split
                self._peak_dirty = False
        return msgspec.structs.replace(sample, allocator=key, process_used=process_used, split=split, peak_split=peak)

    @property
    def next_census(self) -> float:
        """When (``time.monotonic()``) the budget lets the next census outside explained steps run."""
        return self._census_due

    def _split_census(self, count: KindCount, phase: str, step: int) -> None:
        """The split of a census just taken, for the next training-thread sample and the peak."""
        stats = self._stats()
        allocated = stats.allocated if stats is not None else None
        kinds = with_lasting_workspaces(count.kinds, allocated, self.workspace_alive)
        split = MemorySplit(allocated=allocated, by_kind=kinds, unexplained=unexplained(allocated, kinds),
                            phase=phase, step=step, other_parts=count.other_parts)
        self._pending = split
        self._offer_peak(split)

    def _census_when_due(self, phase: str, step: int, force: bool = False) -> None:
        """A census on the training thread, as often as ``CENSUS_BUDGET`` allows (``force``: now, the last)."""
        if not self.options.census or not self.census.has_target:
            return
        now = time.monotonic()
        if now < self._census_due and not force:
            return
        count: KindCount | None = self.census.count(self.activations if self._follows() else None)
        if count is None:
            return
        self._census_due = now + count.seconds / CENSUS_BUDGET
        self._split_census(count, phase, step)

    def _check_request(self, stats: AllocatorStats | None) -> None:
        """A reader asked for an explanation, or the peak rose past the explained one."""
        if self.request is not None and self.request.exists():
            try:
                self.request.unlink()
            except OSError:
                pass
            self._requested = True
        peak = stats.peak_allocated if stats is not None else None
        if (self._trace_peak and peak and peak > self._trace_peak * PEAK_MOVED and self._reexplains < MAX_REEXPLAINS
                and not self._explaining):
            self._reexplains += 1
            self._trace_peak = None
            self._requested = True

    # -- what the probe's other events carry -------------------------------------------------

    def act_bytes(self) -> dict[int, int] | None:
        return self.act_by_module

    def annotate(self, tree: Tree, shards: Shards) -> Shards:
        """``shards`` at stage ``step`` with each module's gradients as held just before the first
        optimizer step, where that was more than now (ZeRO-1/2 free their partitions inside the step)."""
        before = self.grads_before_step
        if shards.stage != "step" or before is None:
            return shards
        names, parents, grads = before
        if names != tree.names or parents != tree.parents:
            return shards
        now = shards.grad_bytes or [0] * len(grads)
        return msgspec.structs.replace(shards, grad_bytes=[max(a, b) for a, b in zip(now, grads, strict=True)])

    def on_oom(self, event: Oom, error: BaseException | None = None) -> Oom:
        """``event`` with the true peak, the allocator's stats and the split at this moment added."""
        self.activations.stop()
        if not self.census.has_target and error is not None:  # out of memory while the model was being built
            self.census.set_target(model_being_built(stack_of(error)))
        # What the graphs hold is read at every OOM (reading them costs nothing before): from the tensors on
        # the failing stack, the node autograd was running, the model's last outputs.
        self.activations.roots = tensors_on_stack(error)
        count = self.census.count(self.activations, also=objects_on_stack(error))
        self.activations.roots = []
        kept_graph = sum(s.nbytes for s in self.activations.kept) if self.activations.failed is None else None
        kept_by = kept_holder(error, self.activations.forward_began) if kept_graph else ""
        stats = self._stats()
        snapshot = memory_snapshot() if self.cuda else None
        if stats is not None and snapshot is not None:
            free_block = largest_free_block(snapshot.get("segments", ()), self.cuda_index)
            stats = msgspec.structs.replace(stats, largest_free_block=free_block)
        allocated = stats.allocated if stats is not None else None
        recording = self.history is not None and self.history.recording
        traced = None
        if snapshot is not None and recording:
            # the trace since set-up: the split at the peak, which a set-up OOM often comes after
            try:
                traced = traced_splits(snapshot, self.cuda_index, self._censuses, self._labels, self.workspaces,
                                       now=count.addresses if count is not None else None)
            except Exception as e:  # noqa: BLE001 - told as a fault; the split at this moment remains
                if self.on_failure is not None:
                    self.on_failure(e)
        memory: MemorySplit | None = None
        if count is not None:
            blocks = None
            if snapshot is not None:
                blocks = traced.at_end if traced is not None else current_split(snapshot, self.cuda_index,
                                                                                 count.addresses)
            memory = split_of_moment(count.kinds, blocks, allocated, event.phase, event.step, traced=recording,
                                     census_parts=count.other_parts)
        at_peak = traced.peak if traced is not None else event.peak_split
        if self.history is not None:
            self.history.stop()
        if snapshot is not None and self.write_snapshot is not None:
            self.write_snapshot("oom", snapshot)
        return msgspec.structs.replace(
            event,
            peak=stats.peak_allocated if stats is not None else event.peak,
            allocator=stats,
            memory=memory if memory is not None else event.memory,
            peak_split=at_peak,
            kept_graph_bytes=kept_graph,
            kept_by=kept_by,
            stack_tensors=stack_tensors(error),
        )

    def close(self) -> None:
        self.activations.stop()
        if self.history is not None:
            self.history.stop()

    def _stats(self) -> AllocatorStats | None:
        if not self.cuda:
            return None
        from shardtop.probe.memory import cuda_allocator_stats

        try:
            return allocator_stats(cuda_allocator_stats(torch, self.cuda_index))
        except Exception:  # noqa: BLE001
            return None
