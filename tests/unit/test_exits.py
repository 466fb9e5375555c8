"""How endings and the probe's own failures are told: pure rules, in process."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from shardtop.probe.exits import ExitRecord, exit_record
from shardtop.probe.faults import Faults
from shardtop.rundir.events import Fault


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as e:  # noqa: BLE001
        return e


class SIGTERMException(SystemExit):
    """Named like Lightning's: a SystemExit of code 0 it raises once a SIGTERM came."""


@pytest.mark.parametrize(
    ("code", "error", "oom", "received", "expected"),
    [
        (0, None, False, None, ExitRecord(0, "ok")),
        (3, None, False, None, ExitRecord(3, "error")),
        (1, ValueError("bad batch"), False, None, ExitRecord(1, "error", None, "ValueError: bad batch")),
        (1, MemoryError(), True, None, ExitRecord(1, "oom", None, "MemoryError")),
        # rank.py's SIGTERM handler raises SystemExit(143): interrupted, not "error (SystemExit: 143)"
        (1, SystemExit(143), False, signal.SIGTERM, ExitRecord(143, "interrupted", signal.SIGTERM, "SIGTERM")),
        (1, KeyboardInterrupt(), False, None, ExitRecord(130, "interrupted", signal.SIGINT, "SIGINT")),
        (128 + signal.SIGHUP, None, False, signal.SIGHUP, ExitRecord(129, "interrupted", signal.SIGHUP, "SIGHUP")),
        (1, SIGTERMException(), False, None, ExitRecord(0, "interrupted", signal.SIGTERM, "SIGTERM")),
        (1, SystemExit(0), False, None, ExitRecord(0, "ok")),
        (1, SystemExit("usage: train.py"), False, None, ExitRecord(1, "error", None, "SystemExit: usage: train.py")),
        # a run that caught the signal and finished anyway finished
        (0, None, False, signal.SIGTERM, ExitRecord(0, "ok")),
    ],
)
def test_exit_record(code: int, error: BaseException | None, oom: bool, received: int | None,
                     expected: ExitRecord) -> None:
    assert exit_record(code, raised(error) if error is not None else None, oom=oom, received=received) == expected


def test_a_failing_part_is_told_once_and_switched_off(capsys: pytest.CaptureFixture[str]) -> None:
    written: list[Fault] = []
    faults = Faults(1, written.append)
    for _ in range(3):
        with faults.guard("shards") as guard:
            raise RuntimeError("no placement until calibrated")
        assert guard.failed
    assert not faults.working("shards") and faults.working("memory")
    assert written == [Fault(part="shards", error="RuntimeError: no placement until calibrated")]
    err = capsys.readouterr().err
    assert err.count("shardtop: the probe's shard reader failed on rank 1") == 1
    assert "It is switched off; training goes on." in err


def test_a_signal_raised_inside_a_part_goes_on() -> None:
    faults = Faults(0, lambda fault: None)
    with pytest.raises(KeyboardInterrupt), faults.guard("shards"):
        raise KeyboardInterrupt
    assert faults.working("shards")


def test_a_process_forked_from_a_rank_has_no_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardtop.probe import current, session

    probe = session.Probe(tmp_path / "run", 0, 1)
    monkeypatch.setattr(current, "_current", probe)  # as set_current does, without its process-wide hooks
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a DataLoader worker, say
        os.write(write, b"none" if current.current() is None else b"probe")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"none"
    assert current.current() is probe
    probe.close()
