"""``--headless``: a run told one line per milestone, rendered from the read model like every view.

Ranks up, every N steps, each OOM (the first first), each rank that ended
otherwise than finishing, and at the end the run's status and the findings
that explain a failure.  No torch, no textual.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from shardtop.diagnose import diagnose
from shardtop.read.follower import RunFollower
from shardtop.read.run_model import RunModel
from shardtop.rundir.run_directory import RunDirectory
from shardtop.units import format_bytes


class HeadlessFollower:
    """Turns a run's events into one line per milestone: ranks up, every N steps, OOM, exit."""

    def __init__(self, run: RunDirectory, out: TextIO, every: int = 10) -> None:
        self.run = run
        self.out = out
        self.every = max(1, every)
        self.follower = RunFollower(run)
        self.said_up = False
        self.up_said: set[int] = set()
        self.followed: int | None = None
        self.last_step_said = 0
        self.ooms_said = 0
        self.ended_said: set[int] = set()
        self.growth_said: set[int] = set()
        self.stalls_said: set[int] = set()

    def say(self, text: str) -> None:
        print(f"[{self.run.id}] {text}", file=self.out, flush=True)

    def poll(self) -> RunModel:
        """Read what is new and say the milestones it brings; the model as it stands."""
        m = self.follower.poll()
        if m is None:  # nothing new: nothing to say
            return self.follower.model()
        return self.tell(m)

    def tell(self, m: RunModel) -> RunModel:
        """Say each milestone of ``m`` not said yet."""
        up = [r for r in m.ranks if r.hello is not None]
        how = ", ".join(x for x in (m.engine, m.strategy) if x)
        if m.rehearsal is not None:  # one rank at a time: each is told as it comes up, and followed
            for r in up:
                if r.rank not in self.up_said:
                    self.up_said.add(r.rank)
                    self.followed, self.last_step_said = r.rank, 0
                    self.say(f"rank {r.rank} of {m.world_size} up, rehearsed on {r.device} ({how}); "
                             "collectives not run")
        elif not self.said_up and up and len(up) >= m.world_size:
            self.said_up = True
            devices = ", ".join(f"rank {r.rank}: {r.device}" for r in up)
            self.say(f"{len(up)} rank(s) up ({how}) - {devices}")
        first = m.rank(self.followed if self.followed is not None else 0) or (m.ranks[0] if m.ranks else None)
        last = first.state.last_step if first is not None else None
        due = last is not None and (last.step == 1 or last.step - self.last_step_said >= self.every)
        if last is not None and due and last.step != self.last_step_said:
            self.last_step_said = last.step
            loss = f" loss {last.loss:.4g}" if last.loss is not None else ""
            secs = f" ({last.seconds * 1000:.0f} ms)" if last.seconds is not None else ""
            self.say(f"step {last.step}{loss}{secs}")
        for story in m.ooms[self.ooms_said :]:
            asked = f", asking for {format_bytes(story.oom.requested_bytes)}" if story.oom.requested_bytes else ""
            engine = f" in {story.oom.engine_step}" if story.oom.engine_step else ""
            self.say(f"{story.headline}{engine if story.module is not None else ''}{asked}")
        self.ooms_said = len(m.ooms)
        for rank, g in m.growth.items():
            if rank not in self.growth_said:
                self.growth_said.add(rank)
                oom_at = g.out_of_memory_step
                when = f"; at this rate it runs out at about step {oom_at}" if oom_at else ""
                self.say(f"warning: rank {rank}'s memory grows {format_bytes(round(g.rate))} every step "
                         f"(steps {g.first_step}-{g.last_step}){when} [memory-grows-every-step]")
        for rank, stall in m.stalls.items():
            if rank not in self.stalls_said:
                self.stalls_said.add(rank)
                ahead = ", ".join(
                    f"rank {p.rank} {'ended' if p.ended else f'at step {p.step}'}" for p in stall.peers[:3]
                )
                said = "" if stall.between_steps else "warning: "
                self.say(f"{said}rank {rank} stalled: {stall.words} ({ahead}) [rank-stalled]")
        self.stalls_said &= set(m.stalls)
        for r in m.ranks:
            if r.rank not in self.ended_said and r.status.ended and r.status.state not in ("finished", "out of memory"):
                self.ended_said.add(r.rank)
                self.say(f"rank {r.rank} {r.status.mark} {r.status.words}")
        return m

    def follow(self, ended: Callable[[RunModel], bool], *, goes_on: str, ref: str) -> bool:
        """Say the milestones until ``ended`` says so of the run as it stands; False where the user stopped
        following (Ctrl-C), after saying that ``goes_on`` (the run, the command) and how to find it (``ref``)."""
        try:
            while not ended(self.poll()):
                time.sleep(0.2)
        except KeyboardInterrupt:
            print(
                f"\nstopped following; {goes_on} goes on. `shardtop attach {ref}` to watch, "
                f"`shardtop stop {ref}` to end it.",
                file=self.out,
                flush=True,
            )
            return False
        return True

    def finish(self) -> int:
        self.poll()
        m = self.follower.finish()
        st = m.state
        if st.skipped or st.inconsistent:
            self.say(f"left out {st.skipped + st.inconsistent} event line(s): {dict(st.skipped_by)}"
                     + (f", {st.inconsistent} inconsistent" if st.inconsistent else ""))
        for f in diagnose(m):
            if f.severity == "error":
                self.say(f"why: {f.title} [{f.code}] - `shardtop report {self.run.id}` says more")
        status = m.status
        code = status.exit.code if status is not None and status.exit and status.exit.code is not None else 1
        if m.rehearsal is not None:
            self.say(m.rehearsal.caveat)
        self.say(f"exit {code}: {m.status_text}  (run directory {self.run.path})")
        return code


def follow(run: RunDirectory, out: TextIO, every: int = 10) -> int:
    """Print milestones until the run ends; returns the run's exit code (from ``exit.json``).

    The run is over once it has an exit record or none of its processes is
    left (a supervisor killed with SIGKILL writes no record: the run is lost).
    """
    follower = HeadlessFollower(run, out, every)
    if not follower.follow(_over, goes_on="the run", ref=run.id):
        return 130
    return follower.finish()


def _over(m: RunModel) -> bool:
    return m.status is not None and m.status.state != "running"
