"""The ``shardtop`` command line: its commands, their arguments and the options every command takes."""

from __future__ import annotations

import argparse
from pathlib import Path

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
  shardtop report RUN --format perfetto > trace.json
                                            the timeline, to open in ui.perfetto.dev
  shardtop plan zero3-linear devices=6 gpu=16GiB   will it fit? memory per rank, before launching
  shardtop plan gpu=A100-80GB -- torchrun --nproc_per_node 8 train.py
                                            plan your own script: it stops before training
  shardtop rehearse zero3-linear devices=6  rank 0 of a 6-GPU job, for real, on the one GPU (or CPU) here
  shardtop rehearse devices=8 rank=0,last -- torchrun --nproc_per_node 8 train.py
                                            ranks of your own N-GPU job, one after another, unchanged
  shardtop fit zero3-linear-fixed devices=6 gpu=16GiB
                                            the largest micro-batch that fits, proven by rehearsals
  shardtop fit devices=8 gpu=H100 -- torchrun --nproc_per_node 8 train.py --batch-size 4
  shardtop export prometheus --listen 9400  live figures of the running runs and GPUs, for Prometheus
  shardtop stop RUN                         stop a run's processes
  shardtop presets                          the presets, one line each

--runs-dir DIR, --read-only and --interval SECONDS work before or after the command.
"""


class Arguments(argparse.Namespace):
    """What the command line says: each command's arguments as argparse reads them, and what ``main`` reads
    around argparse."""

    command: str | None
    settings: list[str]
    """``key=value`` settings (``launch``, ``plan``, ``rehearse``, ``fit``), in the order typed."""
    plan_command: list[str] | None = None
    """The user's command after ``--`` (``plan``, ``rehearse``, ``fit``), as typed: argparse never sees it."""
    whole_process: bool = False
    """``main`` is the process's entry point (the ``shardtop`` command), not a call from Python: a command may
    then leave the process its own way (``plan``)."""


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


def _size(text: str) -> int:
    from shardtop.config import ConfigError, parse_limit

    try:
        size = parse_limit(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if size is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 15GiB or 512MiB")
    return size


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
    p.add_argument("--gpu-mem-limit", metavar="SIZE", type=_size,
                   help="cap each rank's memory (e.g. 15GiB): on a GPU through PyTorch's allocator "
                        "(PYTORCH_CUDA_ALLOC_CONF's per_process_memory_fraction), on CPU through its C allocator "
                        "from torch's import on; a rank past it runs out of memory as on a card that size")
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

    p = sub.add_parser(
        "fit", parents=[common], help="the largest micro-batch and the cheapest set-up that fit N GPUs",
        description="Find the largest micro-batch that fits a job of N GPUs of a size, and the cheapest set-up, "
        "from the plan, proven by rehearsals of rank 0 and the last rank on the one GPU (or CPU) here. "
        "`shardtop fit PRESET devices=N gpu=SIZE|CARD [budget=10m] [key=value ...]` or `shardtop fit devices=N "
        "gpu=SIZE|CARD [budget=10m] -- CMD ARGS` (your command: fit changes only what its line carries, a "
        "micro-batch flag, HF TrainingArguments, the DeepSpeed config it names). On a machine without a GPU, "
        "gpu=SIZE caps each rehearsed CPU rank at that size. Progress on stderr; the table and the pick on stdout.",
    )
    p.add_argument("settings", nargs="*", metavar="devices=N gpu=SIZE|CARD [budget=10m] [PRESET key=value]",
                   help="the job's size and GPUs, the time fit may spend (budget=10m, 90s, 1h), and for a preset "
                        "its name and overrides (gpu_mem_limit=SIZE may stand for gpu=)")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text, or json (docs/fit-json.md)")
    p.add_argument("--fit-dir", type=Path, metavar="DIR",
                   help="fit's own directory, made already: its fit.json and a command's DeepSpeed config copies "
                        "(default: a new one under the runs directory's fits/)")

    p = sub.add_parser("attach", parents=[common], help="watch a run (the newest by default)")
    p.add_argument("run", nargs="?", help="run id, a unique part of it, or a run directory")

    p = sub.add_parser("runs", parents=[common], help="list runs and their status")
    p.add_argument("--limit", type=int, default=20, metavar="N", help="show the N newest (0: all)")

    p = sub.add_parser("report", parents=[common], help="print a run's post-mortem",
                       description="Print a run's post-mortem: text, Markdown (for an issue), JSON (for scripts), "
                                   "or perfetto: its timeline as a trace (one track per rank: phases, steps, memory "
                                   "by kind, the OOM) to open in ui.perfetto.dev or chrome://tracing.")
    p.add_argument("run", nargs="?", help="run id, a unique part of it, or a run directory (default: newest)")
    p.add_argument("--format", choices=("text", "markdown", "json", "perfetto"), default="text",
                   help="text, markdown, json, or perfetto (a trace: shardtop report RUN --format perfetto > run.json)")

    _export_parser(sub, common)

    p = sub.add_parser("stop", parents=[common], help="stop a run: SIGTERM, then SIGKILL after a grace period")
    p.add_argument("run", help="run id, a unique part of it, or a run directory")
    p.add_argument("--grace", type=float, default=10.0, metavar="SECONDS")

    sub.add_parser("presets", parents=[common], help="list the presets")

    p = sub.add_parser("plan", parents=[common], help="will it fit? memory per rank, planned before launching",
                       description="Plan a preset's memory per rank before launching it: the model is built on the "
                                   "meta device, so nothing is allocated and no GPU is needed. It plans what "
                                   "`shardtop launch PRESET` would run on this machine (without a GPU: CPU "
                                   "processes, the preset's CPU sizes) unless gpu= or accelerator= says otherwise. "
                                   "`shardtop plan [devices=N] [gpu=SIZE|CARD] -- CMD ARGS` plans your own command: "
                                   "it runs until the model reaches its engine and its first forward (traced on the "
                                   "meta device), then stops before training.")
    p.add_argument("settings", nargs="*", metavar="PRESET key=value",
                   help="the preset and overrides, plus devices=N and gpu=SIZE|CARD (e.g. gpu=16GiB, gpu=A100-80GB)")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    return parser


def _listen(text: str) -> object:
    from shardtop.export.outputs import parse_listen

    try:
        return parse_listen(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _export_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """``shardtop export prometheus``: where the figures go is the user's to say; nothing is on by default."""
    p = sub.add_parser("export", parents=[common], help="live figures of runs for other tools (Prometheus)",
                       description="Export the live figures of the runs being followed for the tools a fleet "
                                   "already runs.")
    formats = p.add_subparsers(dest="export_format", metavar="prometheus", required=True)
    p = formats.add_parser(
        "prometheus", parents=[common], help="the Prometheus text format, to a textfile or /metrics",
        description="Write the live figures of the runs being followed (the running runs of the runs directory, "
        "or the runs named) and of this host's GPUs in Prometheus's text format: per rank memory by kind, peak, "
        "limit, step, phase and state; per run findings by severity; per GPU what NVML reads. Say where they "
        "go: --textfile for node_exporter's textfile collector, --listen to be scraped, or both. "
        "--interval SECONDS sets how often they are read again (default 5).",
    )
    p.add_argument("runs", nargs="*", metavar="RUN",
                   help="run ids, unique parts of them, or run directories (default: every running run)")
    p.add_argument("--textfile", type=Path, metavar="PATH.prom",
                   help="write to this file for node_exporter's textfile collector, replaced whole each interval")
    p.add_argument("--listen", type=_listen, metavar="[HOST:]PORT",
                   help="serve /metrics on PORT (on 127.0.0.1 unless HOST is given, e.g. 0.0.0.0:9400)")
    p.add_argument("--once", action="store_true",
                   help="one scrape, then exit: the textfile written once, or /metrics served to one request")
