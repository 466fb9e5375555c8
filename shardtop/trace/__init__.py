"""The model traced on the meta device, for the plan: torch's side of ``shardtop.plan``.

A model is built on the meta device (``meta``: shapes and dtypes, nothing
allocated), one forward pass is traced for its saved activations
(``profile``), and both are summed into a ``shardtop.plan.description
.ModelDescription`` (``describe``); everything after that is the plan's
arithmetic, torch-free.  ``recipes`` says how each preset's program builds
its model and runs one batch, ``presets`` describes and plans a preset
(cached), and ``__main__`` (``python -m shardtop.trace``) gives a preset's
description to the TUI's launch prompt from a process that may import torch.

Imports ``shardtop.plan``, torch and ``shardtop.runner.models``; never
``shardtop.inject`` (the bootstrap imports this package to trace the user's
model in its ranks).
"""
