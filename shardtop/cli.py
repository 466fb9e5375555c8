"""The ``shardtop`` command: each command's work (its arguments are ``cli_parser.py``'s).

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

from shardtop.cli_parser import Arguments, build_parser

if TYPE_CHECKING:
    from pathlib import Path

    from shardtop.read.follower import RunFollower

EXIT_USAGE = 2


class UsageError(Exception):
    """A mistake on the command line: message, exit code 2, no traceback."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    command: list[str] | None = None
    if "--" in words:  # `shardtop plan [devices=N gpu=X] -- CMD ARGS`: the user's command, untouched by argparse
        cut = words.index("--")
        head, tail = words[:cut], words[cut + 1:]
        if parser.parse_known_args(head)[0].command in ("plan", "rehearse", "fit"):
            words, command = head, tail
    args, extra = parser.parse_known_args(words, namespace=Arguments(plan_command=command, whole_process=argv is None))
    if extra:
        if args.command in ("launch", "plan", "rehearse", "fit") and not any(e.startswith("-") for e in extra):
            args.settings = [*args.settings, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
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
    from shardtop.launch import TooManyDevices, create_run, resolve_devices, start
    from shardtop.rundir.run_config import RunConfig

    if args.read_only:
        raise UsageError("--read-only forbids launching a run.")
    preset, overrides = split_overrides(args.settings)
    try:
        config = RunConfig.of(resolve_devices(resolve(preset, overrides), gpu_count))
    except TooManyDevices as e:
        raise ConfigError(e.offer(args.settings)) from None
    run = create_run(_root(args), config, ["shardtop", "launch", *args.settings])
    start(run)
    if args.headless:
        print(f"[{run.id}] launched {config.preset} on {config.world_size} {config.accelerator} "
              f"process(es); run directory {run.path}", flush=True)
        return follow(run, sys.stdout, every=args.every)
    return _open_tui(args, run_id=run.id)


def cmd_run(args: argparse.Namespace) -> int:
    from shardtop.own_job.command import follow_command, start_command

    if getattr(args, "read_only", False):
        raise UsageError("--read-only forbids starting a run.")
    job = start_command(args.cmd, runs_dir=args.runs_dir, run_dir=args.run_dir, name=args.name,
                        mem_limit=args.gpu_mem_limit)
    if args.headless:
        return follow_command(job, sys.stdout, every=args.every)
    return _open_tui(args, run_id=str(job.run.path))


def cmd_rehearse(args: argparse.Namespace) -> int:
    from shardtop.rehearse.command import rehearse

    if args.read_only:
        raise UsageError("--read-only forbids starting a rehearsal.")
    return rehearse(args.settings, args.plan_command, runs_dir=args.runs_dir, name=args.name,
                    headless=args.headless or not on_a_terminal(), every=args.every, out=sys.stdout,
                    watch=lambda run: _open_tui(args, run_id=run))


def cmd_attach(args: argparse.Namespace) -> int:
    from shardtop.rundir.run_directory import find_run

    run = find_run(_root(args), args.run)
    return _open_tui(args, run_id=str(run.path))


def cmd_monitor(args: argparse.Namespace) -> int:
    return _open_tui(args, run_id=None)


def on_a_terminal() -> bool:
    """Whether the TUI can run here: it draws on stdout and reads keys from stdin, both a terminal.

    With stdin from ``/dev/null`` or a pipe, Textual's key reader would spin on its end, a core at
    100 %, and no key could quit it.
    """
    return sys.stdout.isatty() and sys.stdin is not None and sys.stdin.isatty()


def _open_tui(args: argparse.Namespace, run_id: str | None) -> int:
    if not on_a_terminal():
        if run_id is None:
            raise UsageError(
                "the monitor needs a terminal to draw on and read keys from (stdin and stdout); "
                "try `shardtop runs` or `shardtop launch --headless`."
            )
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
    from shardtop.words import aligned

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
    for line in aligned(rows):
        print(line)
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


def cmd_export(args: argparse.Namespace) -> int:
    from shardtop.export.command import DEFAULT_INTERVAL_S, ExportRequest, export_prometheus
    from shardtop.export.outputs import OutputError

    if args.textfile is None and args.listen is None:
        raise UsageError("say where the figures go: --textfile PATH.prom (node_exporter's textfile collector) or "
                         "--listen [HOST:]PORT (a /metrics to scrape); e.g. shardtop export prometheus --listen 9400")
    request = ExportRequest(root=_root(args), runs=tuple(args.runs), textfile=args.textfile, listen=args.listen,
                            once=args.once, interval=args.interval or DEFAULT_INTERVAL_S)
    try:
        return export_prometheus(request, sys.stderr)
    except OutputError as e:
        raise UsageError(str(e)) from None


def cmd_plan(args: argparse.Namespace) -> int:
    from shardtop.plan.command import leave_now
    from shardtop.plan_command import run_plan, run_script_plan

    if args.plan_command is not None:
        sys.stdout.write(run_script_plan(args.plan_command, args.settings, args.format))
        return 0
    sys.stdout.write(run_plan(args.settings, args.format))
    if args.whole_process:
        leave_now(0)
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from shardtop.fit.command import fit

    if args.read_only:
        raise UsageError("--read-only forbids starting rehearsals.")
    return fit(args.settings, args.plan_command, runs_dir=args.runs_dir, output_format=args.format,
               out=sys.stdout, err=sys.stderr, fit_dir=args.fit_dir)


COMMANDS = {
    "presets": cmd_presets,
    "launch": cmd_launch,
    "run": cmd_run,
    "attach": cmd_attach,
    "runs": cmd_runs,
    "stop": cmd_stop,
    "report": cmd_report,
    "export": cmd_export,
    "plan": cmd_plan,
    "rehearse": cmd_rehearse,
    "fit": cmd_fit,
}
