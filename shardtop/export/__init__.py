"""``shardtop export``: the live figures of the runs being followed, for the tools fleets already run.

Reads runs as the report does (``shardtop.read``, ``shardtop.diagnose``) and this host's GPUs through
``shardtop.gpus``; imports neither torch nor textual.

- ``exposition.py``: Prometheus's text format
- ``run_metrics.py``: a run's and its ranks' series; ``gpu_metrics.py``: the GPUs'
- ``followed.py``: which runs are exported, read incrementally
- ``outputs.py``: node_exporter's textfile and the ``/metrics`` server
- ``command.py``: ``shardtop export prometheus``, the loop that makes each scrape
"""
