"""``shardtop fit`` started from the TUI: detached, so closing the TUI does not stop it.

Its own directory (under the runs directory's ``fits/``) is made here and named to it (``--fit-dir``):
the progress goes to ``progress.log``, the table to ``fit.txt``, the JSON to ``fit.json``; each rehearsal
is a run of the runs directory, listed in the TUI as it starts.  The fit is started through a short-lived
intermediate (``python -m shardtop.fit.detached``) that starts it in a session of its own and exits at
once, so the TUI has no child to reap, as a launch has none.  No torch here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from shardtop.rundir.run_directory import ensure_root, new_run_id

FITS_DIR = "fits"
PROGRESS_LOG = "progress.log"
TABLE_FILE = "fit.txt"


def fit_directory(root: Path, name: str) -> Path:
    """A new directory for one fit under ``root/fits`` (0700)."""
    path = ensure_root(root) / FITS_DIR / name
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.mkdir(mode=0o700)
    return path


def start_detached(root: Path, settings: Sequence[str]) -> Path:
    """Start ``shardtop fit SETTINGS`` in the background; its directory."""
    directory = fit_directory(root, new_run_id("fit"))
    argv = [sys.executable, "-m", "shardtop", "--runs-dir", str(root), "fit", *settings, "--fit-dir", str(directory)]
    subprocess.run([sys.executable, "-m", "shardtop.fit.detached", str(directory), "--", *argv],
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return directory


def main(argv: list[str] | None = None) -> int:
    """``python -m shardtop.fit.detached DIR -- ARGV``: start ARGV in a session of its own and leave."""
    words = sys.argv[1:] if argv is None else argv
    directory, command = Path(words[0]), words[words.index("--") + 1:]
    with open(directory / TABLE_FILE, "ab") as table, open(directory / PROGRESS_LOG, "ab") as progress:
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=table, stderr=progress, start_new_session=True,
                         close_fds=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
