"""One account of an out-of-memory error, told the same way by every view.

The OOM panel, the report (text, Markdown, JSON), ``shardtop runs``, the
headless follower and the ``oom`` finding all render an ``OomStory``: which
rank, where, which module (named as the tree names it), how it was found, what
the rank held and asked for, and the module stack cut at the same depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardtop.read.memory_kinds import split_sentence
from shardtop.read.other_parts import running_forward
from shardtop.rundir.events import ATTRIBUTED_BY_WORDS, Oom
from shardtop.rundir.memory_figures import MemorySplit
from shardtop.units import format_bytes
from shardtop.words import module_label

STACK_SHOWN = 4
"""Innermost module frames shown; the outer ones are summarised as ``…``."""

FSDP_WRAPPERS = ("FullyShardedDataParallel", "FSDP")
"""Class names FSDP gives the modules it wraps (FSDP1's wrapper; FSDP2's ``FSDP<cls>``)."""


def user_type(type_name: str | None, tree_type: str | None, known_types: Sequence[str] = ()) -> str | None:
    """The user's class for a module: the tree's type where the tree has the module, else
    the OOM's type with FSDP's wrapper class taken off (``FSDPLinear`` → ``Linear``)."""
    if tree_type:
        return tree_type
    if not type_name:
        return None
    if type_name.startswith("FSDP") and type_name[4:] in known_types:
        return type_name[4:]
    if type_name in FSDP_WRAPPERS:
        return None
    return type_name


def under_zero_init(oom: Oom) -> bool:
    """The rank ran out while deepspeed.zero.Init was partitioning a module as it was built."""
    return oom.attributed_by == "init-frame" or (oom.engine_step or "").startswith("Init.")


@dataclass(frozen=True)
class OomStory:
    """Everything a view says about one rank's OOM."""

    oom: Oom
    module_type: str | None
    """The user's class of the culprit (never FSDP's wrapper)."""

    @property
    def rank(self) -> int:
        return self.oom.rank

    @property
    def module(self) -> str | None:
        return self.oom.module

    @property
    def found_by(self) -> str:
        by = self.oom.attributed_by  # a word a newer writer chose is said as it is
        return next((words for key, words in ATTRIBUTED_BY_WORDS.items() if key == by), by)

    @property
    def unnamed(self) -> str:
        """What is known of a module the OOM cannot name: ``a Linear being built under deepspeed.zero.Init``."""
        built = f"a {self.module_type}" if self.module_type else "a module"
        if under_zero_init(self.oom):
            return f"{built} being built under deepspeed.zero.Init"
        return built if self.module_type else ""

    @property
    def culprit(self) -> str:
        """``net.15330 (Linear)``, or what is known without a path: ``not known: a Linear being built …``."""
        if self.oom.module is not None:
            kind = f" ({self.module_type})" if self.module_type else ""
            return f"{module_label(self.oom.module)}{kind}"
        known = self.unnamed
        return "not known" + (f": {known}" if known else "")

    @property
    def when(self) -> str:
        """``during setup (step 0)``, ``during optimizer (step 1)``."""
        return f"during {self.oom.phase}" + (f" (step {self.oom.step})" if self.oom.step else "")

    @property
    def headline(self) -> str:
        """``Rank 1 ran out of memory on cuda:1 during setup in net.15330 (Linear)``."""
        o = self.oom
        where = f" in {self.culprit}" if o.module is not None else (f" in {o.engine_step}" if o.engine_step else "")
        return f"Rank {o.rank} ran out of memory on {o.device} {self.when}{where}"

    @property
    def short(self) -> str:
        """One line for lists: ``OOM on rank 1 during setup in net.15330 (2 MiB requested)``."""
        o = self.oom
        where = f" in {module_label(o.module)}" if o.module is not None else ""
        asked = f" ({format_bytes(o.requested_bytes)} requested)" if o.requested_bytes else ""
        return f"OOM on rank {o.rank} during {o.phase}{where}{asked}"

    @property
    def held(self) -> tuple[tuple[str, int], ...]:
        """What the rank's allocator held then: (label, bytes) for allocated, reserved, limit, device total."""
        o = self.oom
        pairs = (("allocated", o.allocated), ("reserved", o.reserved), ("limit", o.limit), ("device total", o.total))
        return tuple((label, value) for label, value in pairs if value)

    @property
    def held_words(self) -> str:
        """``asked for 2 MiB, 15 GiB allocated, 15 GiB reserved, a limit of 15 GiB``."""
        o = self.oom
        parts = [
            f"asked for {format_bytes(o.requested_bytes)}" if o.requested_bytes else "",
            f"{format_bytes(o.allocated)} already allocated" if o.allocated else "",
            f"{format_bytes(o.reserved)} reserved" if o.reserved else "",
            f"a limit of {format_bytes(o.limit)}" if o.limit else "",
        ]
        return ", ".join(p for p in parts if p)

    @property
    def stack(self) -> tuple[str, ...]:
        """The innermost ``STACK_SHOWN`` module paths of the stack, outermost first."""
        return tuple(self.oom.module_stack[-STACK_SHOWN:])

    @property
    def stack_cut(self) -> bool:
        """More frames were on the stack than ``stack`` shows."""
        return len(self.oom.module_stack) > STACK_SHOWN

    @property
    def stack_words(self) -> str:
        """``… → net → net.15330``."""
        shown = " → ".join(module_label(p) for p in self.stack)
        return ("… → " if self.stack_cut else "") + shown

    @property
    def error_line(self) -> str:
        """The first line of the error message."""
        lines = self.oom.message.strip().splitlines()
        return lines[0] if lines else ""

    def memory_rows(self, peak: MemorySplit | None) -> tuple[tuple[str, str], ...]:
        """What filled the memory at the rank's peak (``peak``: ``RankFacts.memory_peak``) and at the OOM,
        by kind, as (label, sentence): ``at the peak (step 0, setup)``, ``at the OOM``; the request goes
        with the OOM's moment, when it was asked for."""
        rows = []
        if peak is not None:
            at = f" (step {peak.step}, {peak.phase})" if peak.phase and peak.step is not None else ""
            rows.append((f"at the peak{at}", split_sentence(peak, running=running_forward(peak, self.oom))))
        if self.oom.memory is not None:
            rows.append(("at the OOM", split_sentence(self.oom.memory, self.oom.requested_bytes,
                                                      running=running_forward(self.oom.memory, self.oom))))
        return tuple(rows)
