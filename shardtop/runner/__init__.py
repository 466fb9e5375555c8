"""The preset training programs and the process that runs them.

``python -m shardtop.runner RUN_DIR`` is the supervisor (no torch);
``python -m shardtop.runner RUN_DIR --rank N`` is one training rank.
"""
