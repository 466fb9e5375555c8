"""What a run is (``run.json``): one frozen record, written and read here alone.

The launcher, ``shardtop run``, ``shardtop rehearse`` and ranks that make a run
themselves each make a ``RunMeta``; ``RunDirectory`` writes it and reads it
back through ``encode`` and ``decode``, and no reader handles the JSON object
itself.  Runs recorded by older versions read alike: every field is optional,
and a field of the wrong shape reads as missing (``record_fields.py``).  No
torch here, and nothing else of shardtop.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from shardtop.rundir.cluster import SlurmIds
from shardtop.rundir.record_fields import read_fields
from shardtop.rundir.run_config import RunConfig


class RankProcess(msgspec.Struct, frozen=True, kw_only=True):
    """A rank's process as the launcher recorded it when it started the rank (before the rank says hello)."""

    rank: int
    pid: Annotated[int, msgspec.Meta(gt=0)]
    started: float | None = None
    """The process's start time (with the pid, it tells the process from a later one given the same pid)."""


class RunMeta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a run's ``run.json`` says; every field optional, as old and external runs lack some."""

    id: str = ""
    preset: str = ""
    """The preset it runs; empty for a user's own script (a script whose ranks made the run: its name)."""
    created: float | None = None
    host: str = ""
    """The host that made the run: the one whose pids below mean something."""
    user: str = ""
    command: tuple[str, ...] = ()
    cwd: str = ""
    """Where ``shardtop run`` ran the command."""
    config: RunConfig = RunConfig()
    """What the run was configured to do."""
    external: bool = False
    """Made by the ranks of a script rather than by a launcher of shardtop: its ranks write ``exit.json``."""
    own_job: bool = False
    """A user's command run by ``shardtop run``."""
    slurm: SlurmIds | None = None
    """SLURM's job and step where ``shardtop run`` (or the first rank) made the run (None outside SLURM)."""
    pid: int | None = None
    """The run's supervisor, which leads its process group (``pgid``)."""
    pgid: int | None = None
    pid_started: float | None = None
    rank_pids: tuple[RankProcess, ...] = ()
    """The ranks' processes the launcher started, on ``host`` (none for a script's own launcher)."""

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)

    @property
    def title(self) -> str:
        """The preset, or what a script run is: ``(own script)``."""
        return self.preset or self.config.program or "(own script)"

    @property
    def processes(self) -> list[tuple[int, float | None]]:
        """(pid, start time) of the supervisor and the ranks the launcher recorded, on ``host``."""
        supervisor = [(self.pid, self.pid_started)] if self.pid else []
        return supervisor + [(p.pid, p.started) for p in self.rank_pids]


def encode(meta: RunMeta) -> bytes:
    """``run.json``'s bytes: the config's settings and fields in one object, keys sorted, indented."""
    data = msgspec.to_builtins(msgspec.structs.replace(meta, config=RunConfig()))
    if meta.config != RunConfig():
        data["config"] = meta.config.as_json()
    return msgspec.json.format(msgspec.json.encode(data, order="sorted"), indent=2) + b"\n"


def decode(data: bytes) -> RunMeta:
    """The run that ``run.json``'s bytes say; the empty record where they are no JSON object."""
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return RunMeta()
    return parse(raw) if isinstance(raw, Mapping) else RunMeta()


def parse(raw: Mapping[str, Any]) -> RunMeta:
    meta = read_fields(RunMeta, raw, config=RunConfig.parse, command=_command, rank_pids=_rank_processes)
    return msgspec.structs.replace(meta, preset="") if meta.preset == "?" else meta


def _command(raw: object) -> tuple[str, ...]:
    """A command line as written: a list of words, or one string (older runs)."""
    return (raw,) if isinstance(raw, str) else msgspec.convert(raw, tuple[str, ...], strict=True)


def _rank_processes(raw: object) -> tuple[RankProcess, ...]:
    """``rank_pids``: entries of the wrong shape are left out."""
    if not isinstance(raw, list):
        return ()
    kept = []
    for entry in raw:
        try:
            kept.append(msgspec.convert(entry, RankProcess, strict=True))
        except msgspec.ValidationError:
            continue
    return tuple(kept)
