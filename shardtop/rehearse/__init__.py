"""``shardtop rehearse``: rank R of an N-GPU job, for real, on the one GPU (or CPU) at hand.

One process per rehearsed rank, one after another, on this machine's first GPU
(or CPU processes where there is none), each the rank it rehearses through
torch's fake process group (``shardtop.inject.rehearsal``).  The engines build
exactly that rank's shards, partitions and buffers; collectives move no data.
A rehearsal is a run like any other: its directory, events, report and views,
each saying which ranks of how many were rehearsed, and on what.

- ``spec.py``     what was asked: worlds (``devices=2,4,8``) and ranks (``rank=0,last``); pure
- ``start.py``    a preset or a command rehearsed as a run
- ``sweep.py``    several worlds, one run each, and the table of their peaks

No torch here: the ranks import it, not the command that starts them.
"""
