"""A long run to attach to: story 2 on two H200s with many more memory samples before its OOM.

    python bench/long_run.py DEST [--samples 100000] [--attach 3]

Copies the recorded run ``tests/fixtures/runs/h200x2`` (story 2 as asked) into
``DEST`` and, in each rank's event file, repeats the last memory sample before
the OOM ``--samples`` times (their times spread over the 0.3 s before the
OOM), so the files are as long as hours of sampling would make them: the hello,
tree and shards at the head, the OOM and exit at the tail.  For ``bench_ssh.py --attach-run``.

``--attach N`` then attaches to it N times in a 120x40 pseudo-terminal and
prints, from process start, when the screen first holds the header and the
tree (the preset, a module type, a rank column) and when it holds the OOM
(``ran out of memory``: every event read).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.terminal import Terminal  # noqa: E402
from tests.support.recorded import recorded_run  # noqa: E402


def lengthen(events: Path, samples: int) -> None:
    lines = events.read_bytes().splitlines(keepends=True)
    kinds = [json.loads(line)["kind"] for line in lines]
    at = kinds.index("oom")
    last = json.loads(lines[at - 1])
    t0 = last["t"]
    padding = []
    for i in range(samples):
        last["t"] = t0 + 0.3 * i / samples
        padding.append(json.dumps(last, separators=(",", ":")).encode() + b"\n")
    events.write_bytes(b"".join([*lines[:at], *padding, *lines[at:]]))


def attach(run: Path) -> tuple[float, float]:
    """Seconds from start to the header and tree on screen, and to the OOM on screen."""
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        copy = runs / run.name
        shutil.copytree(run, copy)
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
        term = Terminal([sys.executable, "-m", "shardtop", "attach", str(copy), "--runs-dir", str(runs)],
                        size=(120, 40), env=env)
        try:
            first = term.wait_for(b"zero3-linear", b"Linear", b"r0", timeout=120)
            oom = term.wait_for(b"ran out of memory", timeout=120)
        finally:
            term.close()
    return first, oom


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--samples", type=int, default=100_000, help="memory samples added to each rank's file")
    parser.add_argument("--attach", type=int, default=0, metavar="N", help="then attach to it N times")
    args = parser.parse_args()
    source = recorded_run("h200x2/zero3-linear")
    run = args.dest / source.name
    shutil.copytree(source, run)
    for events in sorted((run / "events").glob("rank-*.jsonl")):
        lengthen(events, args.samples)
    size = sum(p.stat().st_size for p in (run / "events").iterdir())
    print(f"{run}: {size / 2**20:.0f} MiB of events")
    for _ in range(args.attach):
        first, oom = attach(run)
        print(f"  attach: header and tree {first:.2f} s, the OOM {oom:.2f} s", flush=True)


if __name__ == "__main__":
    main()
