"""Will it fit: memory per rank, planned before the launch.

``shardtop plan PRESET`` builds the preset's model on the meta device
(nothing allocated, no GPU needed), traces one forward pass for its saved
activations, and predicts for each rank the parameters, gradients,
optimizer state, activations, gathered units, engine buffers and the peak of
set-up, forward, backward and the optimizer step, for the strategy the
preset runs and the alternatives that matter.

Two steps, so that a launch prompt can replan on every keystroke:

- ``shardtop.trace.presets.describe_preset(config)`` (torch, cached per model
  sizes and batch) -> ``ModelDescription``, a msgspec struct;
- ``compare.make_plan(description, strategy, devices=..., gpu=...)`` (pure,
  torch-free, milliseconds) -> ``Plan``.

``shardtop.trace.presets.plan_config`` does both for a resolved preset
config.  This package is the arithmetic only: it imports neither torch nor
an engine, nor ``runner/``, ``inject/`` or ``trace/`` (the model traced on
the meta device), nor textual.  Modules: ``description`` (the struct),
``preset_strategies`` (the strategy each preset runs), ``presets`` (a
preset's plan from its description), ``strategies``, ``memory`` (the one
model of memory; ``held`` what an engine holds, ``zero`` DeepSpeed ZeRO's
holdings and set-up, ``fsdp2`` FSDP2's backward unit by unit, ``saved``
the activations at a strategy's precision, ``allocator`` what the caching
allocator must hold for such a set-up), ``options``, ``verdict``, ``cards``,
``compare``,
``render``/``json_plan``, ``command`` (the CLI's settings; the command
itself is ``shardtop.plan_command``); ``script`` and ``asked`` (``shardtop
plan -- CMD``: the user's own command, traced in its ranks by
``shardtop.inject.plan_only``); ``record`` (the plan a run writes at set-up,
set against the run by ``shardtop.read.plan_check``).
"""
