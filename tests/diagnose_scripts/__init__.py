"""User-style training scripts for what no preset shows, and ``real_runs``: the runs the
diagnosis and report tests share (each made once per test session)."""
