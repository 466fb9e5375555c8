"""How a run ended and what state it is in: read from ``exit.json`` and its processes.

``exit.json`` (written once, by the supervisor, or by ``shardtop stop`` when
the supervisor could not)::

    code            shell-style exit code of the run (0: finished; 128+N: signal N)
    signal          the signal behind ``code``, or null
    ended           Unix time the record was written
    ending          how it ended, typed (``ExitReason``): finished, stopped, failed or interrupted
    reason          the same in words for people: "finished", "stopped", "rank N failed", ...
    stop_requested  Unix time a stop was asked for (``shardtop stop``, a signal to the supervisor), or null
    ranks           [{rank, code, signal, stopped}], one per rank, by rank
    peers_stopped   {after_rank, at, killed} or null

No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

ExitReason = Literal["finished", "stopped", "failed", "interrupted"]
"""How a run ended, as the writer of ``exit.json`` knew it (its ``ending``): every rank finished,
shardtop stopped it (``shardtop stop``, a signal to the supervisor), a rank or the supervisor failed,
or a signal from elsewhere ended a rank."""

RunState = Literal["running", "finished", "failed", "interrupted", "stopped", "lost"]
"""How a run stands (``RunStatus.state``): running, one of the ``ExitReason``s, or lost (no exit
record and no process left)."""


@dataclass(frozen=True)
class RankExit:
    """How one rank ended, as its supervisor saw it."""

    rank: int
    code: int
    """Shell-style: the process's exit code, or 128 + the signal that ended it."""
    signal: int | None = None
    """The signal that ended it, if one did."""
    stopped: bool = False
    """shardtop's supervisor signalled it (after another rank failed, or on ``stop``).

    ``signal=9, stopped=False`` is a SIGKILL from elsewhere (the kernel's OOM
    killer, a user); ``signal=9, stopped=True`` is shardtop ending a rank that
    did not stop within the grace period."""


@dataclass(frozen=True)
class PeersStopped:
    """The supervisor stopped the remaining ranks because one rank failed."""

    after_rank: int
    """The rank whose failure made the supervisor stop the others."""
    at: float
    """When it sent them SIGTERM (Unix time)."""
    killed: bool = False
    """Some did not end within the grace period and got SIGKILL."""


@dataclass(frozen=True)
class RunExit:
    """How the run ended: ``exit.json``, parsed."""

    code: int | None
    signal: int | None = None
    ended: float | None = None
    reason: str = ""
    """The ending in words for people: ``rank 1 failed``, ``command failed on node-2``."""
    ending: ExitReason = "failed"
    ranks: tuple[RankExit, ...] = ()
    """Every rank's exit, by rank; empty when no supervisor wrote the record."""
    peers_stopped: PeersStopped | None = None
    stop_requested: float | None = None
    """When the run was asked to stop; a rank that failed after it failed in the stop."""

    @property
    def ok(self) -> bool:
        return self.code == 0

    @classmethod
    def from_json(cls, data: Any) -> RunExit | None:
        """Parse ``exit.json``; None if it is not an exit record. Unknown fields are ignored."""
        if not isinstance(data, dict):
            return None
        ranks: list[RankExit] = []
        for entry in data.get("ranks") or ():
            try:
                ranks.append(
                    RankExit(
                        rank=int(entry["rank"]),
                        code=int(entry["code"]),
                        signal=None if entry.get("signal") is None else int(entry["signal"]),
                        stopped=bool(entry.get("stopped", False)),
                    )
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        peers = data.get("peers_stopped")
        peers_stopped: PeersStopped | None = None
        if isinstance(peers, dict):
            try:
                peers_stopped = PeersStopped(
                    after_rank=int(peers["after_rank"]), at=float(peers["at"]), killed=bool(peers.get("killed"))
                )
            except (KeyError, TypeError, ValueError):
                pass
        code, words = _int_or_none(data.get("code")), str(data.get("reason") or "")
        return cls(
            code=code,
            signal=_int_or_none(data.get("signal")),
            ended=data.get("ended") if isinstance(data.get("ended"), (int, float)) else None,
            reason=words,
            ending=_exit_reason(data.get("ending"), words, code),
            ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
            peers_stopped=peers_stopped,
            stop_requested=_float_or_none(data.get("stop_requested")),
        )


EXIT_REASONS: tuple[ExitReason, ...] = get_args(ExitReason)


def _exit_reason(ending: object, words: str, code: int | None) -> ExitReason:
    """The record's ``ending``; for a record without one, what its words and code say.

    Of such a record's words only ``stopped`` decides: an interrupted rank's
    record also carries its signal, which ``ended_state`` reads.
    """
    for reason in EXIT_REASONS:
        if ending == reason:
            return reason
    if words == "stopped":
        return "stopped"
    return "finished" if code == 0 else "failed"


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


INTERRUPTING_SIGNALS = frozenset({1, 2, 15})
"""SIGHUP, SIGINT, SIGTERM: someone ended the run (a closed terminal, Ctrl-C, a scheduler)."""


def ended_state(record: RunExit) -> RunState:
    """The state of a run that ended as ``record`` says.

    Stopped wins (shardtop ended it on purpose); a code of 0 with no signal
    finished, whatever the writer expected; a failure by a signal from
    elsewhere (a closed terminal, Ctrl-C, a scheduler) was interrupted.
    """
    if record.ending == "stopped":
        return "stopped"
    if record.code == 0 and not record.signal:
        return "finished"
    if record.ending == "interrupted" or record.signal in INTERRUPTING_SIGNALS:
        return "interrupted"
    return "failed"


@dataclass(frozen=True)
class RunStatus:
    state: RunState
    """running, finished, failed, interrupted (a signal or Ctrl-C ended it, not ``shardtop stop``),
    stopped (``shardtop stop``) or lost (no exit record and no process)."""
    exit: RunExit | None = None

    def describe(self) -> str:
        if self.exit is None or self.state == "running":
            return self.state
        if self.exit.signal:
            import signal as _signal

            try:
                name = _signal.Signals(self.exit.signal).name
            except ValueError:
                name = f"signal {self.exit.signal}"
            return f"{self.state} ({name})"
        if self.state == "failed":
            return f"failed (exit {self.exit.code})"
        return self.state
