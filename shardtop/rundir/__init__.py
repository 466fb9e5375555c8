"""The run directory: the contract the ranks write and every reader reads.

The event schema (``events``) and the engines' names (``engines``), the
directory itself and how a run is found again (``run_directory``), what the
run is and what it was asked to do (``run_meta``, ``run_config``: frozen
records, read one field at a time by ``record_fields``), whether its
processes are still there (``liveness``, ``run_members``), how it ended
(``run_status``), the hosts and SLURM ids of its processes (``cluster``), and
the files written whole or once (``json_files``, ``reserved_file``).  No
torch, no Textual, and no other module of shardtop: both sides import this and
nothing else of each other.
"""
