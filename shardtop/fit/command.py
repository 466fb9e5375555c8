"""``shardtop fit PRESET devices=N gpu=SIZE|CARD [budget=10m]`` and ``shardtop fit devices=N gpu=… -- CMD``.

What is asked is read and checked first (a bad setting, a preset with no rank to rehearse, a command with
nothing fit can change: exit 2, nothing made).  Then the plan of each set-up, the set-ups in the plan's
order (largest planned batch first, least offload first among equals), and for each the search from the
plan's batch to the boundary, one rehearsal at a time, while the budget lasts.  Progress goes to stderr
(which set-up, which batch, what it gave, what is left, the time spent of the budget); the table and the
pick to stdout, in text or JSON (``docs/fit-json.md``), and as ``fit.json`` into fit's own directory
under the runs directory, beside the DeepSpeed config copies a command's set-ups use.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from shardtop.config import ConfigError
from shardtop.fit.configuration import Configuration, Knob
from shardtop.fit.measure import Trial
from shardtop.fit.predict import PlannedOnly, Prediction, TracedPlan, planned_only
from shardtop.fit.request import Allowance, FitRequest, allowance, read_fit_request
from shardtop.fit.result import FitResult, SetupResult, Use
from shardtop.fit.search import BoundarySearch
from shardtop.fit.stacks import CommandStack, PresetStack
from shardtop.fit.trial import REHEARSED_RANKS, Rehearser, rank_threads
from shardtop.units import format_bytes

RESULT_FILE = "fit.json"
"""In fit's own directory (``detached.fit_directory``): the result, as ``--format json`` prints it."""


@dataclass(frozen=True)
class Machine:
    """This machine as fit rehearses on it."""

    gpus: int
    first_gpu_total: int | None
    on: str
    """What a rehearsal runs on, in words."""
    cores: int

    @property
    def accelerator(self) -> str:
        return "cuda" if self.gpus else "cpu"


def this_machine() -> Machine:
    from shardtop.gpus import gpu_count
    from shardtop.launch import cpu_room
    from shardtop.own_job.mem_cap import first_gpu_total
    from shardtop.rehearse.start import device_words, first_gpu_name

    gpus = gpu_count()
    return Machine(gpus=gpus, first_gpu_total=first_gpu_total() if gpus else None,
                   on=device_words(gpus, "cuda" if gpus else "cpu", first_gpu_name), cores=cpu_room().cores)


@dataclass(frozen=True)
class Target:
    """What is fitted, checked: the stack, its knobs and set-ups, and the plan of each."""

    title: str
    stack: PresetStack | CommandStack
    knobs: tuple[Knob, ...]
    predictions: tuple[Prediction, ...]
    searchable: bool
    """The micro-batch is a knob: each set-up's boundary is searched (else each is tried at its own batch)."""
    planned_only: tuple[PlannedOnly, ...] = ()
    """Strategies the plan gives a larger batch that the stack has no knob for."""
    given_batch: int | None = None
    """The micro-batch as given (the preset's, the command's flag or DeepSpeed config): where a set-up's
    search starts when the plan gives no batch."""

    def first_batch(self, prediction: Prediction) -> int:
        """Where the search of ``prediction``'s set-up starts: the plan's batch; the batch as given where the
        plan gives none (then it doubles up); one where the plan says not even one fits."""
        if prediction.no_guess:
            return self.given_batch or 1
        return prediction.largest_batch or 1


@dataclass
class Progress:
    """Lines on stderr while fit searches: which set-up, which batch, the time spent of the budget."""

    err: TextIO
    budget_s: float
    clock: Callable[[], float] = time.monotonic
    started: float = 0.0

    def __post_init__(self) -> None:
        self.started = self.clock()

    @property
    def spent(self) -> float:
        return self.clock() - self.started

    def say(self, text: str) -> None:
        print(f"fit [{clock_words(self.spent)} of {clock_words(self.budget_s)}]: {text}", file=self.err, flush=True)


def clock_words(seconds: float) -> str:
    """``0:42``, ``12:05``, ``1:02:03``."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _gpu_of(request: FitRequest, machine: Machine) -> Allowance:
    gpu = request.gpu
    if gpu is None and machine.accelerator == "cuda":
        from shardtop.plan.cards import local_gpu

        gpu = local_gpu()
    if gpu is None:
        raise ConfigError(
            "which GPUs has the job? e.g. gpu=16GiB or gpu=A100-80GB (or gpu_mem_limit=15GiB). On a machine "
            "without a GPU each rehearsed rank is a CPU process capped at that size."
        )
    return allowance(gpu, machine.accelerator, machine.first_gpu_total)


def _preset_target(request: FitRequest, machine: Machine, allowed: Allowance) -> Target:
    from shardtop.fit.predict import predictions, preset_plan
    from shardtop.gpus import gpu_count
    from shardtop.rehearse.spec import RehearsalSpec
    from shardtop.rehearse.start import preset_config

    settings = [*request.settings, *([f"gpu_mem_limit={allowed.cap}"] if allowed.cap is not None else [])]
    ranks = RehearsalSpec(worlds=(request.devices,), ranks=REHEARSED_RANKS).ranks_of(request.devices)
    config = preset_config(settings, request.devices, ranks, gpu_count)  # as the rehearsals run it
    plan = preset_plan(config, devices=request.devices, accelerator=str(config["accelerator"]))
    stack = PresetStack.of(request.settings, config, plan.strategy.label)
    cuda = config["accelerator"] == "cuda"
    confs = stack.configurations(cuda)
    found = predictions({None: plan}, confs, devices=request.devices, gpu=allowed.judged)
    return Target(title=stack.preset, stack=stack, knobs=stack.knobs(cuda), predictions=tuple(found),
                  searchable=True, planned_only=_unexposed(plan, found, request, allowed),
                  given_batch=stack.batch_size)


def _unexposed(plan: TracedPlan, found: Sequence[Prediction], request: FitRequest,
               allowed: Allowance) -> tuple[PlannedOnly, ...]:
    """The plan's other strategies that would take a larger batch than any set-up fit can try."""
    searched = {p.strategy for p in found}
    best = max((p.largest_batch or 0 for p in found), default=0)
    return tuple(p for p in planned_only(plan, devices=request.devices, gpu=allowed.judged, beyond=best)
                 if p.strategy not in searched)


def command_stack(command: list[str], cuda: bool) -> CommandStack:
    """The command read and checked: something fit can change, or a ``ConfigError`` that says why not."""
    import shutil

    if not command:
        raise ConfigError("shardtop fit -- needs your command after --, e.g. "
                          "shardtop fit devices=8 gpu=H100 -- torchrun --nproc_per_node 8 train.py --batch-size 4")
    if shutil.which(command[0]) is None:
        raise ConfigError(f"cannot run {command[0]!r}: it is not on PATH or not a file.")
    stack = CommandStack.of(command, Path.cwd())
    knobs = stack.knobs(cuda)
    if not {k.kind for k in knobs if k.found} & {"micro-batch", "activation checkpointing", "sharding", "offload"}:
        said = "; ".join(f"{k.kind}: {k.where}" for k in knobs if not k.found)
        raise ConfigError(f"nothing to search in this command: fit changes only what its line carries. {said}.")
    return stack


def _command_target(stack: CommandStack, request: FitRequest, machine: Machine, allowed: Allowance,
                    directory: Path, progress: Progress) -> Target:
    from shardtop.fit.predict import command_plan, predictions

    cuda = machine.accelerator == "cuda"
    knobs = stack.knobs(cuda)
    given = stack.configurations(cuda, os.environ)[0]
    plans: dict[bool | None, TracedPlan] = {}
    for checkpointing in ([False, True] if stack.shape.trainer else [None]):
        conf = given if checkpointing == given.checkpointing else given.but(checkpointing=checkpointing)
        progress.say(f"planning {conf.label}: the command runs to its model's first forward, traced on the meta "
                     "device")
        stack.write_deepspeed(conf, stack.given_batch, directory)
        plans[checkpointing] = command_plan(stack.command_at(conf, stack.given_batch, directory), request.devices)
    for line in no_forward_lines(plans.values(), stack.given_batch):
        progress.say(line)
    stack = replace(stack, strategy_words=plans[given.checkpointing].strategy.label)
    confs = stack.configurations(cuda, os.environ)
    found = predictions(plans, confs, devices=request.devices, gpu=allowed.judged)
    return Target(title=shlex.join(stack.shape.argv), stack=stack, knobs=knobs, predictions=tuple(found),
                  searchable=stack.given_batch is not None and any(k.kind == "micro-batch" and k.found for k in knobs),
                  planned_only=_unexposed(plans[given.checkpointing], found, request, allowed),
                  given_batch=stack.given_batch)


def no_forward_lines(plans: Iterable[TracedPlan], given_batch: int | None) -> list[str]:
    """What progress says of plans that traced no forward: each thing they said, once."""
    start = f"the command's own micro-batch ({given_batch})" if given_batch else "one sample"
    return [f"the plan traced no forward, so it gives no micro-batch (activations not planned): {said}. Each "
            f"set-up's search starts at {start} and doubles."
            for said in dict.fromkeys(p.no_forward for p in plans if p.no_forward)]


def order(found: Sequence[Prediction]) -> list[Prediction]:
    """The plan's ranking: the largest planned batch first, then the least offload, then the one as given."""
    return sorted(found, key=lambda p: (-(p.largest_batch or 0), p.configuration.offload_level,
                                        not p.configuration.as_given))


def fit(
    settings: Sequence[str], command: list[str] | None, *, runs_dir: str | None, output_format: str,
    out: TextIO, err: TextIO, fit_dir: Path | None = None,
) -> int:
    """Run the search; 0 where some set-up fits, 1 where none does (2, by ``ConfigError``, for bad input).
    ``fit_dir``: fit's own directory, made already (the TUI's); else a new one under the runs directory."""
    import shutil

    from shardtop.fit.detached import fit_directory
    from shardtop.rundir.run_directory import new_run_id, runs_root

    request = read_fit_request(settings, command=command is not None)
    machine = this_machine()
    allowed = _gpu_of(request, machine)
    stack = command_stack(command, machine.accelerator == "cuda") if command is not None else None
    progress = Progress(err, request.budget_s)
    root = runs_root(runs_dir)
    directory: Path | None = fit_dir
    try:
        if stack is None:
            target = _preset_target(request, machine, allowed)
        else:
            directory = directory or fit_directory(root, new_run_id("fit"))
            target = _command_target(stack, request, machine, allowed, directory, progress)
    except ConfigError:
        if directory is not None and directory != fit_dir:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    if directory is None:
        directory = fit_directory(root, new_run_id("fit"))
    rehearser = Rehearser(
        devices=request.devices, cap=allowed.cap, runs_dir=str(root), directory=directory,
        env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or rank_threads(request.devices, machine.cores)}
        if machine.accelerator == "cpu" else {},
    )
    setups = search_all(target, rehearser, allowed.limit, progress)
    result = FitResult(
        title=target.title, devices=request.devices, gpu=_gpu_words(request, allowed), limit=allowed.limit,
        on=machine.on, knobs=target.knobs, setups=tuple(setups), seconds=progress.spent,
        budget_s=request.budget_s, planned_only=target.planned_only,
    )
    result = replace(result, use=_use(result, target, request, directory))
    from shardtop.fit.render import render_json, render_text

    (directory / RESULT_FILE).write_text(render_json(result))
    out.write(render_json(result) if output_format == "json" else render_text(result, directory))
    out.flush()
    return 0 if result.pick is not None else 1


def _gpu_words(request: FitRequest, allowed: Allowance) -> str:
    gpu = request.gpu
    return gpu.name if gpu is not None else allowed.judged.name


def _use(result: FitResult, target: Target, request: FitRequest, directory: Path) -> Use | None:
    pick = result.pick
    if pick is None or pick.largest is None:
        return None
    conf, batch = pick.configuration, pick.largest.batch
    if isinstance(target.stack, PresetStack):
        line, changes = target.stack.use(conf, batch, request.devices)
    else:
        line, changes = target.stack.use(conf, batch, directory)
    return Use(line=line, changes=tuple(changes))


def search_all(target: Target, rehearser: Rehearser, limit: int, progress: Progress) -> list[SetupResult]:
    """Each set-up in the plan's order: ruled out, searched to its boundary, or left for the budget."""
    ranked = order(target.predictions)
    results: list[SetupResult] = []
    durations: list[float] = []
    for i, prediction in enumerate(ranked):
        conf = prediction.configuration
        head = f"[{i + 1}/{len(ranked)}] {conf.label}"
        if prediction.ruled_out(limit):
            progress.say(f"{head}: not rehearsed, the plan needs {format_bytes(prediction.peak_at_one)} at one sample "
                         f"against {format_bytes(limit)}")
            results.append(SetupResult(prediction, (), "ruled out",
                                       note=f"the plan needs {format_bytes(prediction.peak_at_one)} at one sample"))
            continue
        if not _time_left(progress, durations):
            results.append(SetupResult(prediction, (), "not reached", note="the budget was spent first"))
            continue
        left = len(ranked) - i - 1
        result = _search_one(target, rehearser, prediction, limit, progress, durations, head, left)
        results.append(result)
    return results


def _time_left(progress: Progress, durations: list[float]) -> bool:
    """Whether another rehearsal may start: the first always does; then one as long as the average so far
    must end within the budget."""
    if not durations:
        return True
    return progress.spent + sum(durations) / len(durations) <= progress.budget_s


def _search_one(target: Target, rehearser: Rehearser, prediction: Prediction, limit: int, progress: Progress,
                durations: list[float], head: str, left: int) -> SetupResult:
    conf = prediction.configuration
    if not target.searchable:
        return _as_given_batch(target, rehearser, prediction, limit, progress, durations, head)
    search = BoundarySearch(start=target.first_batch(prediction), limit=limit, plan_slope=prediction.slope)
    trials: list[Trial] = []
    while (batch := search.next_batch()) is not None:
        if not _time_left(progress, durations):
            return SetupResult(prediction, tuple(trials), "budget", note="the budget was spent before the boundary")
        why = _why(search, prediction, trials)
        progress.say(f"{head}: rehearsing micro-batch {batch} ({why}); {left} more set-up(s) after this one")
        trial = _rehearse(target.stack, rehearser, conf, batch)
        durations.append(trial.seconds)
        trials.append(trial)
        search = search.after(trial.probe)
        progress.say(f"{head}: micro-batch {batch} {_told(trial, limit)} in {trial.seconds:.0f} s; run {trial.run_id}")
    if search.failed is not None:
        return SetupResult(prediction, tuple(trials), "failed", note=trials[-1].detail)
    if not any(t.outcome == "fits" for t in trials):
        return SetupResult(prediction, tuple(trials), "nothing fits", note="not even one sample fits")
    return SetupResult(prediction, tuple(trials), "found")


def _why(search: BoundarySearch, prediction: Prediction, trials: Sequence[Trial]) -> str:
    """Why the next batch: the plan's or the one as given, the line through what was measured, or a doubling
    or halving where there is no line to follow."""
    if not trials:
        return "the batch as given: the plan gives none" if prediction.no_guess else "the plan's"
    if search.line() is not None:
        return "where the line through what was measured meets the limit"
    if search.fitting is None:
        return "half the smallest that ran out of memory"
    if search.too_large is None:
        return "twice the largest that fit"
    return "halfway between the largest that fit and the smallest that ran out"


def _as_given_batch(target: Target, rehearser: Rehearser, prediction: Prediction, limit: int, progress: Progress,
                    durations: list[float], head: str) -> SetupResult:
    """A command whose micro-batch fit cannot change: the set-up rehearsed once, at the command's own batch."""
    if durations and not _time_left(progress, durations):
        return SetupResult(prediction, (), "not reached", note="the budget was spent first")
    progress.say(f"{head}: rehearsing the command's own micro-batch (no knob changes it)")
    trial = _rehearse(target.stack, rehearser, prediction.configuration, None)
    durations.append(trial.seconds)
    progress.say(f"{head}: {_told(trial, limit)} in {trial.seconds:.0f} s; run {trial.run_id}")
    if trial.outcome == "failed":
        return SetupResult(prediction, (trial,), "failed", note=trial.detail)
    if trial.outcome != "fits":
        return SetupResult(prediction, (trial,), "nothing fits", note="its own micro-batch does not fit")
    return SetupResult(prediction, (trial,), "found")


def _rehearse(stack: PresetStack | CommandStack, rehearser: Rehearser, conf: Configuration,
              batch: int | None) -> Trial:
    if isinstance(stack, PresetStack):
        assert batch is not None
        return rehearser.preset(stack, conf, batch)
    return rehearser.command(stack, conf, batch)


def _told(trial: Trial, limit: int) -> str:
    if trial.outcome == "fits":
        return f"fits: peak {format_bytes(trial.peak)} of {format_bytes(limit)}"
    if trial.outcome == "out of memory":
        rank = trial.largest
        where = f" (rank {rank.rank}, {rank.oom_phase})" if rank is not None and rank.oom_phase else ""
        return f"runs out of memory{where}"
    return f"failed: {trial.detail}"
