"""The ``shardtop`` command.

Everything heavy (textual, torch) is imported inside the command that needs
it, so ``shardtop --help`` and ``shardtop runs`` start at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from shardtop.read.follower import RunFollower

EXIT_USAGE = 2

DESCRIPTION = """\
nvtop for sharded training: live GPU memory, the module -> device shard tree of
a running FSDP or DeepSpeed engine, and why a rank ran out of memory.

  shardtop                                  the monitor: GPUs, processes, runs, presets
  shardtop launch preset=zero3-linear       start a preset run and watch it
  shardtop launch fsdp2-mlp --headless max_steps=3
  shardtop run -- torchrun --nproc_per_node 8 train.py
                                            your own command as a run, unchanged
  shardtop attach [RUN]                     watch a run (the newest by default)
  shardtop runs                             list runs and their status
  shardtop report RUN --format markdown     the post-mortem, for a bug report
  shardtop plan zero3-linear devices=6 gpu=16GiB   will it fit? memory per rank, before launching
  shardtop plan gpu=A100-80GB -- torchrun --nproc_per_node 8 train.py
                                            plan your own script: it stops before training
  shardtop rehearse zero3-linear devices=6  rank 0 of a 6-GPU job, for real, on the one GPU (or CPU) here
  shardtop rehearse devices=8 rank=0,last -- torchrun --nproc_per_node 8 train.py
                                            ranks of your own N-GPU job, one after another, unchanged
  shardtop stop RUN                         stop a run's processes
  shardtop presets                          the presets, one line each

--runs-dir DIR, --read-only and --interval SECONDS work before or after the command.
"""


class UsageError(Exception):
    """A mistake on the command line: message, exit code 2, no traceback."""


INTERVAL_RANGE = (0.05, 60.0)
"""Seconds between screen updates that ``--interval`` accepts."""


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    low, high = INTERVAL_RANGE
    if not low <= value <= high:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds between {low} and {high:g}, e.g. --interval 2")
    return value


def _global_options(parser: argparse.ArgumentParser, here: bool) -> None:
    """The options every command takes, before or after the command's name.

    On the main parser (``here``) they get their defaults; on each command's
    parser they are suppressed when absent, so ``shardtop --runs-dir X runs``
    keeps X instead of the command's default overwriting it.
    """
    absent = None if here else argparse.SUPPRESS
    parser.add_argument(
        "--runs-dir",
        metavar="DIR",
        default=absent,
        help="where runs live (default: $SHARDTOP_RUNS_DIR, else ~/.local/state/shardtop/runs)",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        default=False if here else argparse.SUPPRESS,
        help="no action that changes anything (no launch, no stop)",
    )
    parser.add_argument(
        "--interval",
        type=_interval,
        metavar="SECONDS",
        default=absent,
        help="seconds between screen updates (default: $SHARDTOP_REFRESH, else 1)",
    )


def build_parser() -> argparse.ArgumentParser:
    from shardtop import __version__

    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, here=False)
    parser = argparse.ArgumentParser(
        prog="shardtop",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_options(parser, here=True)
    parser.add_argument("--version", action="version", version=f"shardtop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("launch", parents=[common], help="start a preset run and watch it",
                       description="Start a preset run. Settings: key=value, dotted for nested keys "
                                   "(model.n_layers=64).")
    p.add_argument("settings", nargs="*", metavar="preset=NAME key=value",
                   help="the preset (preset=NAME or just NAME) and overrides")
    p.add_argument("--headless", action="store_true",
                   help="no TUI: print one line per milestone and exit with the run's exit code")
    p.add_argument("--every", type=int, default=10, metavar="N", help="with --headless, print every N steps")

    p = sub.add_parser(
        "run", parents=[common], help="run your own training command as a shardtop run, unchanged",
        description="Run any training command (python, torchrun, deepspeed, a Lightning CLI) as a shardtop "
        "run: the probe enters every Python rank, no change to the script. Detached like launch: it survives "
        "the terminal, `shardtop attach` finds it. SHARDTOP_DISABLE=1 runs the command without the probe.",
    )
    p.add_argument("--run-dir", metavar="DIR",
                   help="the run's own directory (default: $SHARDTOP_RUN_DIR); on shared storage, the same "
                   "--run-dir on every host makes one run of all hosts")
    p.add_argument("--name", metavar="NAME", help="what to call the run (default: the script's name)")
    p.add_argument("--headless", action="store_true",
                   help="no TUI: print one line per milestone and exit with the command's own exit code")
    p.add_argument("--every", type=int, default=10, metavar="N", help="with --headless, print every N steps")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command to run")

    p = sub.add_parser(
        "rehearse", parents=[common], help="rank R of an N-GPU job, for real, on the one GPU (or CPU) here",
        description="Run rank R of a job of N GPUs as one process on this machine's first GPU (or CPU), through "
        "torch's fake process group: the engine builds exactly the shards, partitions and buffers that rank "
        "builds in the real job; collectives move no data. `shardtop rehearse PRESET devices=N [rank=R] "
        "[key=value ...]` or `shardtop rehearse devices=N [rank=R] -- CMD ARGS` (your command, unchanged: "
        "torchrun, the deepspeed launcher, accelerate launch, python with Lightning or HF Trainer). "
        "rank=R: a rank, last, all, or a list (rank=0,last), rehearsed one after another; devices=2,4,8 "
        "rehearses each job size and tabulates the peaks.",
    )
    p.add_argument("settings", nargs="*", metavar="devices=N rank=R [PRESET key=value]",
                   help="the job's size (devices=N or devices=2,4,8), the ranks (rank=0, last, all, 0,last), "
                        "and for a preset its name and overrides; gpu=SIZE|CARD to judge what fits")
    p.add_argument("--headless", action="store_true",
                   help="no TUI: print one line per milestone and exit with the run's exit code")
    p.add_argument("--every", type=int, default=10, metavar="N", help="with --headless, print every N steps")
    p.add_argument("--name", metavar="NAME", help="what to call a command's run (default: the script's name)")

    p = sub.add_parser("attach", parents=[common], help="watch a run (the newest by default)")
    p.add_argument("run", nargs="?", help="run id, a unique part of it, or a run directory")

    p = sub.add_parser("runs", parents=[common], help="list runs and their status")
    p.add_argument("--limit", type=int, default=20, metavar="N", help="show the N newest (0: all)")

    p = sub.add_parser("report", parents=[common], help="print a run's post-mortem")
    p.add_argument("run", nargs="?", help="run id, a unique part of it, or a run directory (default: newest)")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")

    p = sub.add_parser("stop", parents=[common], help="stop a run: SIGTERM, then SIGKILL after a grace period")
    p.add_argument("run", help="run id, a unique part of it, or a run directory")
    p.add_argument("--grace", type=float, default=10.0, metavar="SECONDS")

    sub.add_parser("presets", parents=[common], help="list the presets")

    p = sub.add_parser("plan", parents=[common], help="will it fit? memory per rank, planned before launching",
                       description="Plan a preset's memory per rank before launching it: the model is built on the "
                                   "meta device, so nothing is allocated and no GPU is needed. "
                                   "`shardtop plan [devices=N] [gpu=SIZE|CARD] -- CMD ARGS` plans your own command: "
                                   "it runs until the model reaches its engine and its first forward (traced on the "
                                   "meta device), then stops before training.")
    p.add_argument("settings", nargs="*", metavar="PRESET key=value",
                   help="the preset and overrides, plus devices=N and gpu=SIZE|CARD (e.g. gpu=16GiB, gpu=A100-80GB)")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    command: list[str] | None = None
    if "--" in words:  # `shardtop plan [devices=N gpu=X] -- CMD ARGS`: the user's command, untouched by argparse
        cut = words.index("--")
        head, tail = words[:cut], words[cut + 1:]
        if parser.parse_known_args(head)[0].command in ("plan", "rehearse"):
            words, command = head, tail
    args, extra = parser.parse_known_args(words)
    args.plan_command = command
    if extra:
        if args.command in ("launch", "plan", "rehearse") and not any(e.startswith("-") for e in extra):
            args.settings = list(args.settings) + list(extra)
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.whole_process = argv is None
    from shardtop.config import ConfigError
    from shardtop.rundir.run_directory import RunError

    try:
        handler = COMMANDS.get(args.command or "", cmd_monitor)
        return handler(args)
    except (ConfigError, RunError, UsageError) as e:
        print(f"shardtop: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_went_away()


def _reader_went_away() -> int:
    """``shardtop runs | head -1``: the reader closed the pipe; leave quietly, as ``ls`` would.

    Python would otherwise print a second BrokenPipeError while flushing
    stdout at exit, so stdout is pointed at /dev/null first.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def _root(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from shardtop.rundir.run_directory import runs_root

    return runs_root(args.runs_dir)


def cmd_presets(args: argparse.Namespace) -> int:
    from shardtop.config import list_presets

    presets = list_presets()
    width = max(len(p.name) for p in presets)
    for p in presets:
        print(f"{p.name:<{width}}  {p.description}")
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from shardtop.config import ConfigError, resolve, split_overrides
    from shardtop.gpus import gpu_count
    from shardtop.headless import follow
    from shardtop.launch import TooManyDevices, resolve_devices, start
    from shardtop.rundir.run_directory import RunDirectory, ensure_root

    if args.read_only:
        raise UsageError("--read-only forbids launching a run.")
    preset, overrides = split_overrides(args.settings)
    try:
        config = resolve_devices(resolve(preset, overrides), gpu_count)
    except TooManyDevices as e:
        raise ConfigError(e.offer(args.settings)) from None
    root = ensure_root(_root(args))
    run = RunDirectory.create(
        root,
        config["preset"],
        {"config": config, "command": ["shardtop", "launch", *args.settings]},
    )
    start(run)
    if args.headless:
        print(f"[{run.id}] launched {config['preset']} on {config['world_size']} {config['accelerator']} "
              f"process(es); run directory {run.path}", flush=True)
        return follow(run, sys.stdout, every=args.every)
    return _open_tui(args, run_id=run.id)


def cmd_run(args: argparse.Namespace) -> int:
    from shardtop.own_job.command import follow_command, start_command

    if getattr(args, "read_only", False):
        raise UsageError("--read-only forbids starting a run.")
    job = start_command(args.cmd, runs_dir=args.runs_dir, run_dir=args.run_dir, name=args.name)
    if args.headless:
        return follow_command(job, sys.stdout, every=args.every)
    return _open_tui(args, run_id=str(job.run.path))


def cmd_rehearse(args: argparse.Namespace) -> int:
    from shardtop.rehearse.command import rehearse

    if args.read_only:
        raise UsageError("--read-only forbids starting a rehearsal.")
    run_id = rehearse(args.settings, args.plan_command, runs_dir=args.runs_dir, name=args.name,
                      headless=args.headless or not sys.stdout.isatty(), every=args.every, out=sys.stdout)
    if isinstance(run_id, int):
        return run_id
    return _open_tui(args, run_id=run_id)


def cmd_attach(args: argparse.Namespace) -> int:
    from shardtop.rundir.run_directory import find_run

    run = find_run(_root(args), args.run)
    return _open_tui(args, run_id=str(run.path))


def cmd_monitor(args: argparse.Namespace) -> int:
    return _open_tui(args, run_id=None)


def _open_tui(args: argparse.Namespace, run_id: str | None) -> int:
    if not sys.stdout.isatty():
        if run_id is None:
            raise UsageError("the monitor needs a terminal; try `shardtop runs` or `shardtop launch --headless`.")
        from shardtop.headless import follow
        from shardtop.rundir.run_directory import find_run

        run = find_run(_root(args), run_id)
        return follow(run, sys.stdout)
    root = _root(args)
    from shardtop.tui.first_frame import painted

    # the top of the home screen, or of the run's view, is drawn at once, plainly, while Textual loads
    follower = _follower(root, run_id)
    frame_of = None
    if follower is not None:
        from shardtop.tui.run_frame import run_frame

        frame_of = partial(run_frame, follower)
    with painted(frame_of=frame_of) as driver:
        from shardtop.tui.app import run_app

        return run_app(
            runs_root=root, run=run_id, read_only=args.read_only, refresh=args.interval, driver_class=driver,
            follower=follower,
        )


def _follower(root: Path, run_id: str | None) -> RunFollower | None:
    """A follower of the run the TUI opens at once; None for the home screen or a run not found (the app
    says so in words)."""
    if run_id is None:
        return None
    from shardtop.read.follower import RunFollower
    from shardtop.rundir.run_directory import RunError, find_run

    try:
        return RunFollower(find_run(root, run_id))
    except RunError:
        return None


def cmd_runs(args: argparse.Namespace) -> int:
    from shardtop.read.run_summary import summarize
    from shardtop.rundir.run_directory import list_runs

    root = _root(args)
    runs = list_runs(root)
    if args.limit:
        runs = runs[-args.limit:]
    if not runs:
        print(f"no runs under {root}. Start one with: shardtop launch preset=fsdp2-mlp")
        return 0
    rows = [("RUN", "STATUS", "RANKS", "STEP", "STARTED", "NOTE")]
    for run in runs:
        s = summarize(run)
        rows.append((run.id, s.status, s.ranks_cell, str(s.step), s.started, s.note))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        # The last column is not padded: it has no width.
        print("  ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from shardtop.launch import stop
    from shardtop.rundir.run_directory import find_run

    if args.read_only:
        raise UsageError("--read-only forbids stopping a run.")
    run = find_run(_root(args), args.run)
    if not stop(run, grace=args.grace):
        print(f"run {run.id} is not running ({run.status().describe()}); nothing to stop.")
        return 0
    print(f"run {run.id}: {run.status().describe()}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from shardtop.report import render_report
    from shardtop.rundir.run_directory import find_run

    run = find_run(_root(args), args.run)
    print(render_report(run, args.format))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from shardtop.plan.command import leave_now, run_plan

    if args.plan_command is not None:
        from shardtop.plan.script import run_script_plan

        sys.stdout.write(run_script_plan(args.plan_command, args.settings, args.format))
        return 0
    sys.stdout.write(run_plan(args.settings, args.format))
    if args.whole_process:
        leave_now(0)
    return 0


COMMANDS = {
    "presets": cmd_presets,
    "launch": cmd_launch,
    "run": cmd_run,
    "attach": cmd_attach,
    "runs": cmd_runs,
    "stop": cmd_stop,
    "report": cmd_report,
    "plan": cmd_plan,
    "rehearse": cmd_rehearse,
}
