"""One set-up at one micro-batch rehearsed as a run: rank 0 and the last rank, one after another.

Each rehearsal is a run like any other (``shardtop rehearse``'s): its directory, its events, its report,
its view in the TUI.  Once a rank has run out of memory, the ranks still to come would tell nothing
more: the run is stopped there and counts as out of memory.  On CPU a rehearsed rank runs with the
threads a rank of the job has here (``shardtop launch`` gives each of N ranks its share of the cores):
oneDNN's scratch buffers grow with the threads, and a rank with more than the job's would hold more.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from shardtop.fit.command_line import FIT_STEPS
from shardtop.fit.configuration import Configuration
from shardtop.fit.measure import Trial, trial_of
from shardtop.fit.stacks import CommandStack, PresetStack, alloc_env
from shardtop.rehearse.spec import AskedRank, RehearsalSpec
from shardtop.rundir.run_directory import RunDirectory

POLL_S = 0.5
REHEARSED_RANKS: tuple[AskedRank, ...] = (0, "last")
STOP_GRACE_S = 5.0


def rank_threads(devices: int, cores: int) -> str:
    """``OMP_NUM_THREADS`` of one rank of a job of ``devices`` ranks on this machine's ``cores``."""
    return str(max(1, cores // max(1, devices)))


@contextmanager
def environment(changes: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``changes`` while processes are started (they inherit it), then as it was."""
    before = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass(frozen=True)
class Rehearser:
    """How fit rehearses: the job's size, the cap, where runs go, what every rehearsal's environment adds."""

    devices: int
    cap: int | None
    runs_dir: str | None
    directory: Path
    """Fit's own directory: a command's DeepSpeed config copies."""
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def spec(self) -> RehearsalSpec:
        return RehearsalSpec(worlds=(self.devices,), ranks=REHEARSED_RANKS)

    def preset(self, stack: PresetStack, conf: Configuration, batch: int) -> Trial:
        from shardtop.rehearse.start import start_one

        started_at = time.monotonic()
        with environment({**self.env, **alloc_env(conf, os.environ)}):
            started = start_one(self.spec, self.devices, stack.settings_at(conf, batch, self.cap), None,
                                runs_dir=self.runs_dir, name=None)
        return self._wait(started.run, batch, FIT_STEPS, started_at)

    def command(self, stack: CommandStack, conf: Configuration, batch: int | None) -> Trial:
        from shardtop.rehearse.start import start_one

        started_at = time.monotonic()
        stack.write_deepspeed(conf, batch, self.directory)
        argv = stack.command_at(conf, batch, self.directory)
        with environment({**self.env, **alloc_env(conf, os.environ)}):
            started = start_one(self.spec, self.devices, [], argv, runs_dir=self.runs_dir, name=None,
                                mem_limit=self.cap)
        steps = FIT_STEPS if stack.sets_steps else 1
        return self._wait(started.run, batch or stack.given_batch or 0, steps, started_at)

    def _wait(self, run: RunDirectory, batch: int, min_steps: int, started_at: float) -> Trial:
        from shardtop.launch import stop
        from shardtop.read.follower import RunFollower
        from shardtop.read.whole_run import read_run

        follower = RunFollower(run)
        while True:
            model = follower.poll() or follower.model()
            if follower.status is not None and follower.status.state != "running":
                break
            ended_short = any(r.status.state == "out of memory" and r.exit is not None for r in model.ranks)
            if ended_short and len(model.ranks) < len(model.expected_ranks):
                stop(run, grace=STOP_GRACE_S, out=lambda _line: None)
                break
            time.sleep(POLL_S)
        return trial_of(read_run(run), batch, min_steps=min_steps, seconds=time.monotonic() - started_at,
                        run_id=run.id, path=str(run.path))
