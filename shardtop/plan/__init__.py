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
(the one model of memory), ``options``, ``verdict``, ``cards``, ``compare``,
``render``/``json_plan``, ``command`` (the CLI).  Importing this package
imports neither torch nor textual.
"""
