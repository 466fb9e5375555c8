"""What the TUI reads off the event loop: run directories, NVML, processes.

Each feed is a plain class with a ``poll()`` that a screen's worker thread
calls in a loop (so polls never overlap) and that returns an immutable
snapshot, or ``None`` when nothing changed.  No Textual here.
"""
