"""The read side: a run's events folded into one read model, and the facts every view asks.

``run_fold`` folds the events into a ``run_state`` snapshot, ``run_model``
answers, with ``run.json``'s record (``rundir/run_meta.py``), what the TUI, the report,
``shardtop runs`` and the diagnosis ask (the engine, the OOMs, each rank's
holdings and status, the plan against what was measured); ``whole_run`` reads a
whole run from disk, and ``follower`` follows a live one for the TUI, the run
list and ``--headless``.  Imports only ``shardtop.rundir`` and the small
helpers (``units``, ``words``): no torch, no Textual, nothing of the plan's
engine code.
"""
