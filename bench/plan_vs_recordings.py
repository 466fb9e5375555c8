"""Each finished GPU recording of a preset (``tests/fixtures/runs``) planned again and set against its peak.

Prints, per recording: the planned peak, the allocator's measured peak (highest over the ranks), the error,
the plan's phase at its peak and what it holds there, and the recording's own split by kind at its peak
(``peak_split``: phase, step and the largest kinds).  No GPU needed.

    python bench/plan_vs_recordings.py [--all] [NAME-SUBSTRING...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardtop.plan.cards import card, limited  # noqa: E402
from shardtop.rundir.event_files import read_all  # noqa: E402
from shardtop.rundir.events import Memory  # noqa: E402
from shardtop.rundir.run_directory import RunDirectory  # noqa: E402
from shardtop.trace.presets import plan_config  # noqa: E402

RUNS = ROOT / "tests" / "fixtures" / "runs"
MIB = 2**20


def _kinds(split: object) -> str:
    by_kind = getattr(split, "by_kind", None)
    if by_kind is None:
        return ""
    fields = {k: getattr(by_kind, k) for k in by_kind.__struct_fields__}
    big = sorted(((v, k) for k, v in fields.items() if isinstance(v, int) and v > 8 * MIB), reverse=True)
    return " ".join(f"{k}={v / MIB:.0f}" for v, k in big)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--all", action="store_true", help="also runs that did not finish")
    args = ap.parse_args()
    errors = []
    for path in sorted(RUNS.glob("*/*/")):
        if not (path / "run.json").is_file():
            continue
        name = f"{path.parent.name}/{path.name}"
        if args.names and not any(n in name for n in args.names):
            continue
        run = RunDirectory(path)
        config = run.read_meta().config.settings
        if config.get("accelerator") != "cuda" or "preset" not in config:
            continue
        status = run.status()
        finished = status.exit is not None and status.exit.code == 0
        if not finished and not args.all:
            continue
        events, _ = read_all(run.events_dir)
        memory = [e for e in events if isinstance(e, Memory)]
        total = next((g.total for m in memory if m.gpus for g in m.gpus), None)
        limit = config.get("gpu_mem_limit")
        gpu = limited(int(limit)) if limit else card("recorded GPU", int(total or 0), "the recording")
        top = max(memory, key=lambda m: m.peak or 0)
        peak = top.peak or 0
        plan = plan_config(config, devices=int(config["devices"]), accelerator="cuda", gpu=gpu)
        p = plan.asked.per_rank
        error = (p.peak - peak) / peak
        errors.append(abs(error))
        last = [m for m in memory if m.rank == top.rank and m.peak_split is not None]
        split = last[-1].peak_split if last else None
        print(f"{name}  [{plan.asked.strategy.label}, {config['devices']} ranks]")
        print(f"  planned {p.peak / MIB:9.1f} MiB ({p.peak_phase})  measured {peak / MIB:9.1f} MiB (rank {top.rank})"
              f"  error {error:+.1%}")
        print(f"  plan: params {p.params / MIB:.0f} grads {p.grads / MIB:.0f} optim {p.optimizer / MIB:.0f}"
              f" act {p.activations / MIB:.0f} gathered {p.gathered / MIB:.0f} buffers {p.buffers / MIB:.0f}"
              f" step_tmp {p.step_temporary / MIB:.0f} unit_grads {p.unit_grads / MIB:.0f}"
              f" conv {p.conv_workspace / MIB:.0f} rounding {p.rounding / MIB:.0f}")
        print("  plan timeline: " + " ".join(f"{v / MIB:.0f}" for v in p.timeline))
        if split is not None:
            print(f"  measured at peak: {split.phase} step {split.step} alloc "
                  f"{(split.allocated or 0) / MIB:.0f} unexplained {(split.unexplained or 0) / MIB:.0f}: "
                  f"{_kinds(split)}")
    if errors:
        print(f"{len(errors)} recordings: mean |error| {sum(errors) / len(errors):.1%}, worst {max(errors):.1%}")


if __name__ == "__main__":
    main()
