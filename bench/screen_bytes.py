"""Where a terminal program's bytes go: per screen line, and by what they are (text, colours, moves).

    python bench/screen_bytes.py DUMP [DUMP ...] [--top 12]

A dump is the raw bytes a program wrote to its terminal (``bench_ssh.py --dump``
writes one per program and refresh: the measuring window only).  The cursor is
followed through absolute and relative moves, carriage returns and new lines,
and every byte is counted against the screen line the cursor is on when it is
written.  Each byte is one of:

- ``text``: what the terminal draws (characters, UTF-8 sequences whole),
- ``style``: SGR sequences (colours, bold...),
- ``move``: cursor positioning (``CSI H``, ``A``-``G``, ``d``, carriage return, new line),
- ``other``: the rest (synchronised output, cursor shown or hidden, erasures, OSC).

It also counts updates: bursts of bytes with no gap of 20 ms or more, read
from a dump's ``.times`` file where there is one.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

CSI = re.compile(rb"\x1b\[([0-?]*)([ -/]*)([@-~])")
OSC = re.compile(rb"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
SHORT = re.compile(rb"\x1b[()][0-9A-Za-z]|\x1b[=>78DEHMNOPZc]")
KINDS = ("text", "style", "move", "other")


@dataclass
class Tally:
    by_line: defaultdict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    by_kind: Counter[str] = field(default_factory=Counter)
    total: int = 0

    def add(self, line: int, kind: str, count: int) -> None:
        self.by_line[line][kind] += count
        self.by_kind[kind] += count
        self.total += count


def _numbers(params: bytes) -> list[int]:
    return [int(p) if p.isdigit() else 0 for p in params.split(b";")] if params else []


def tally(data: bytes) -> Tally:
    """Every byte of ``data`` counted against the line the cursor is on and what kind of byte it is."""
    t = Tally()
    row = 0
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if b == 0x1B:
            m = CSI.match(data, i)
            if m:
                params, final = m.group(1), m.group(3)
                size = m.end() - i
                args = _numbers(params)
                first = args[0] if args and args[0] else 1
                if final == b"m":
                    t.add(row, "style", size)
                elif final in b"CDG`":
                    t.add(row, "move", size)
                elif final in b"HfdABEF":
                    if final in b"Hfd":
                        row = first - 1
                    elif final in b"BE":
                        row += first
                    else:
                        row = max(0, row - first)
                    t.add(row, "move", size)  # a move is counted on the line it goes to, for what follows there
                else:
                    t.add(row, "other", size)
                i = m.end()
                continue
            m = OSC.match(data, i) or SHORT.match(data, i)
            size = m.end() - i if m else 1
            t.add(row, "other", size)
            i += size
            continue
        if b == 0x0A:
            row += 1
            t.add(row, "move", 1)
        elif b == 0x0D or b == 0x08:
            t.add(row, "move", 1)
        elif b < 0x20:
            t.add(row, "other", 1)
        else:
            t.add(row, "text", 1)
        i += 1
    return t


def updates(times: Path, gap: float = 0.02) -> int:
    """Bursts of writes in a ``.times`` file (one ``seconds bytes`` pair per read of the pty)."""
    stamps = [float(line.split()[0]) for line in times.read_text().splitlines() if line.strip()]
    return sum(1 for a, b in zip([float("-inf"), *stamps], stamps, strict=False) if b - a >= gap)


def report(path: Path, top: int) -> None:
    data = path.read_bytes()
    t = tally(data)
    times = path.with_suffix(".times")
    seconds = None
    if times.exists():
        stamps = [float(line.split()[0]) for line in times.read_text().splitlines() if line.strip()]
        seconds = stamps[-1] - stamps[0] if len(stamps) > 1 else None
        print(f"{path.name}: {t.total} bytes, {updates(times)} updates" + (f" in {seconds:.1f} s" if seconds else ""))
    else:
        print(f"{path.name}: {t.total} bytes")
    print("  " + "  ".join(f"{k} {t.by_kind[k]} ({100 * t.by_kind[k] / max(1, t.total):.0f} %)" for k in KINDS))
    print(f"  {'line':>4}  {'bytes':>6}  " + "  ".join(f"{k:>5}" for k in KINDS))
    ranked = sorted(t.by_line.items(), key=lambda kv: -sum(kv[1].values()))
    for line, kinds in ranked[:top]:
        print(f"  {line + 1:>4}  {sum(kinds.values()):>6}  " + "  ".join(f"{kinds[k]:>5}" for k in KINDS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dumps", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=12, help="screen lines to show, most bytes first")
    args = parser.parse_args()
    for path in args.dumps:
        report(path, args.top)


if __name__ == "__main__":
    main()
