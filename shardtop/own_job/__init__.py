"""``shardtop run -- CMD``: the user's own training command as a shardtop run, unchanged.

- ``command.py``     the command line side: make (or join) the run, start the
                     supervisor detached, follow it headless
- ``supervisor.py``  one per host and run, in its own session (it survives the
                     terminal): runs CMD with the probe's bootstrap on its
                     ``PYTHONPATH`` (``shardtop.inject``), records its exit code

On several hosts, ``shardtop run --run-dir /shared/dir -- CMD`` on each joins
one run; each host's supervisor keeps its own record (``run_members.py``) and
the run ends when every host's command has.  No torch here.
"""
