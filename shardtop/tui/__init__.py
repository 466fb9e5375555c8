"""The terminal UI: runs in the TUI process and never imports torch.

``app.run_app`` is the entry point the CLI calls.  Widgets live one per module
in ``widgets/``, screens in ``screens/``, and everything that reads files,
NVML or processes lives in ``watch/`` and runs in worker threads that post
immutable snapshots to the screens.
"""
