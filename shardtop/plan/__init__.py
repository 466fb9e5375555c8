"""Will it fit: memory per rank, planned before the launch.

``shardtop plan PRESET`` builds the preset's model on the meta device
(nothing allocated, no GPU needed), traces one forward pass for its saved
activations, and predicts for each rank the parameters, gradients,
optimizer state, activations, gathered units, engine buffers and the peak of
set-up, forward, backward and the optimizer step, for the strategy the
preset runs and the alternatives that matter.

Two steps, so that a launch prompt can replan on every keystroke:

- ``presets.describe_preset(config)`` (torch, cached per model sizes and batch)
  -> ``ModelDescription``, a msgspec struct;
- ``compare.make_plan(description, strategy, devices=..., gpu=...)`` (pure,
  torch-free, milliseconds) -> ``Plan``.

``presets.plan_config`` does both for a resolved preset config.  Modules:
``description`` (the struct), ``meta``/``profile``/``describe`` (torch side),
``recipes`` (how each preset builds and runs), ``strategies``, ``memory``
(the one model of memory; ``held`` what an engine holds, ``zero`` DeepSpeed
ZeRO's holdings and set-up, ``allocator`` what the caching allocator must
hold for such a set-up), ``options``, ``verdict``, ``cards``, ``compare``,
``render``/``json_plan``, ``command`` (the CLI); ``script`` and ``asked``
(``shardtop plan -- CMD``: the user's own command, traced in its ranks by
``shardtop.inject.plan_only``); ``record`` (the plan a run writes at set-up,
set against the run by ``shardtop.read.plan_check``); ``__main__`` (a preset's
description for the TUI's launch prompt, from a process that may import
torch).  Importing this package imports neither torch nor textual.
"""
