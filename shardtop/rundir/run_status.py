"""How a run ended and what state it is in: read from ``exit.json`` and its processes.

``exit.json`` (written once, by the supervisor, or by ``shardtop stop`` when
the supervisor could not)::

    code            shell-style exit code of the run (0: finished; 128+N: signal N)
    signal          the signal behind ``code``, or null
    ended           Unix time the record was written
    reason          "finished", "stopped", "rank N failed", ...
    stop_requested  Unix time a stop was asked for (``shardtop stop``, a signal to the supervisor), or null
    ranks           [{rank, code, signal, stopped}], one per rank, by rank
    peers_stopped   {after_rank, at, killed} or null

No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
class ExitStatus:
    code: int | None
    signal: int | None = None
    ended: float | None = None
    reason: str = ""
    ranks: tuple[RankExit, ...] = ()
    """Every rank's exit, by rank; empty when no supervisor wrote the record."""
    peers_stopped: PeersStopped | None = None
    stop_requested: float | None = None
    """When the run was asked to stop; a rank that failed after it failed in the stop."""

    @property
    def ok(self) -> bool:
        return self.code == 0

    @classmethod
    def from_json(cls, data: Any) -> ExitStatus | None:
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
        return cls(
            code=_int_or_none(data.get("code")),
            signal=_int_or_none(data.get("signal")),
            ended=data.get("ended") if isinstance(data.get("ended"), (int, float)) else None,
            reason=str(data.get("reason") or ""),
            ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
            peers_stopped=peers_stopped,
            stop_requested=_float_or_none(data.get("stop_requested")),
        )


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


INTERRUPTING_SIGNALS = frozenset({1, 2, 15})
"""SIGHUP, SIGINT, SIGTERM: someone ended the run (a closed terminal, Ctrl-C, a scheduler)."""


@dataclass(frozen=True)
class RunStatus:
    state: str
    """running, finished, failed, interrupted (a signal or Ctrl-C ended it, not ``shardtop stop``),
    stopped (``shardtop stop``) or lost (no exit record and no process)."""
    exit: ExitStatus | None = None

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
