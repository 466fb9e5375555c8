"""Whether a process we recorded is still the one running: its pid *and* its start time.

A pid alone is not enough: the system reuses pids, so a record also keeps the
process's start time, and a process counts as ours only while both match.
No torch here.
"""

from __future__ import annotations


def process_start_time(pid: int) -> float | None:
    import psutil

    try:
        started: float = psutil.Process(pid).create_time()
        return started
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def is_running(pid: int, started: float | None) -> bool:
    """Is this still the process we recorded: alive, not a zombie, same start time (no pid reuse)?"""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        actual = proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return started is None or abs(actual - float(started)) < 1.0
