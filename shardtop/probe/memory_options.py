"""How much the probe explains of a rank's memory: its options, and how a reader asks for more.

Set in the rank's environment (a launcher passes its own through):

- ``SHARDTOP_EXPLAIN_STEPS`` (default 2): the first steps explained in full
  (saved activations per module, a census at every phase, on CUDA the
  allocator's history); 0 explains none unless asked.
- ``SHARDTOP_MEMORY_DETAIL``: ``steps`` (default), ``always`` (follow saved
  activations in every step, at about 5 µs per saved tensor), ``off`` (no
  census on the sampler thread either).
- ``SHARDTOP_MEMORY_TRACE=0``: never record the CUDA allocator's history.
- ``SHARDTOP_MEMORY_TRACE_ENTRIES``: the history's ring buffer (default 100 000 entries).

A reader asks for the next steps to be explained by creating the file
``REQUEST_FILE`` in the run directory; the rank's sampler thread finds it
within a sample, removes it, and explains the next ``explain_steps`` steps
(at least one).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shardtop.probe.allocator import DEFAULT_MAX_ENTRIES
from shardtop.rundir.events import MEMORY_REQUEST_FILE

REQUEST_FILE = Path(MEMORY_REQUEST_FILE)
"""Created in the run directory by a reader (the TUI's key) to have the next steps explained."""


@dataclass(frozen=True)
class MemoryOptions:
    """What the probe explains, and when (the module docstring lists the variables)."""

    explain_steps: int = 2
    always: bool = False
    """Follow activations in every step, not only in explained ones."""
    trace: bool = True
    """Record the CUDA allocator's history while explaining."""
    census: bool = True
    trace_entries: int = DEFAULT_MAX_ENTRIES

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> MemoryOptions:
        detail = environ.get("SHARDTOP_MEMORY_DETAIL", "steps").strip().lower()
        steps = environ.get("SHARDTOP_EXPLAIN_STEPS", "").strip()
        entries = environ.get("SHARDTOP_MEMORY_TRACE_ENTRIES", "").strip()
        return cls(
            explain_steps=int(steps) if steps.isdigit() else cls.explain_steps,
            always=detail == "always",
            trace=environ.get("SHARDTOP_MEMORY_TRACE", "1").strip() not in ("0", "off", "false", "no"),
            census=detail != "off",
            trace_entries=int(entries) if entries.isdigit() else DEFAULT_MAX_ENTRIES,
        )
