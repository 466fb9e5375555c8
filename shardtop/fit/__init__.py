"""``shardtop fit``: the largest micro-batch that fits N GPUs of a size, and the cheapest set-up, found
from the plan and proven by rehearsals on the one device here.

The plan ranks the set-ups the user's stack lets fit change from outside (a preset's keys; a command's
flags, its DeepSpeed config file, its environment) and predicts each one's largest micro-batch; then
rehearsals of rank 0 and the last rank, each a run of its own, find the real boundary from there: the
batch that fits and the next one that runs out of memory.

- ``request.py``       what was asked: devices, the GPU and what a rank may hold, the budget; pure
- ``configuration.py`` a set-up fit tries (ZeRO stage, offload, checkpointing, allocator) and the knobs; pure
- ``command_line.py``  a user's command: where its knobs are, and the command at another set-up; pure
- ``stacks.py``        a preset or a command as fit drives it: its knobs, set-ups and use-lines
- ``predict.py``       the plan of each set-up, and the batch it predicts
- ``search.py``        the bracketing search from the plan's batch to the boundary; pure
- ``trial.py``         one set-up at one batch rehearsed as a run, and what it measured
- ``result.py``        each set-up's outcome and the pick; pure
- ``render.py``        the table and the pick in words, and the JSON (``docs/fit-json.md``); pure
- ``command.py``       the command: progress on stderr, the result on stdout
- ``detached.py``      ``shardtop fit`` started from the TUI, detached, its output kept in files

No torch is imported here except through the plan (``predict.py``), in the command's own process; the
TUI imports only ``request.py`` and ``detached.py``.
"""
