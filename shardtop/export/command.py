"""``shardtop export prometheus``: the followed runs' figures and this host's GPUs, every interval, to a
textfile, to ``/metrics``, or both.

One loop makes every scrape: it reads what the runs appended, samples NVML, renders the text, and hands
it to the outputs; the HTTP thread only serves the latest.  ``once``: one scrape, written (and, when
listening, served to the first request that asks) before the command returns.  NVML missing is said once
on stderr, and the GPUs then have no series.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from shardtop.export.exposition import Sample, render
from shardtop.export.followed import FollowedRuns
from shardtop.export.gpu_metrics import gpu_samples, read_gpus
from shardtop.export.outputs import ListenAddress, MetricsServer, TextFile
from shardtop.export.run_metrics import run_samples
from shardtop.gpus import GpuSource, GpuUnavailable, Nvml
from shardtop.rundir.cluster import host_name

DEFAULT_INTERVAL_S = 5.0


@dataclass(frozen=True)
class ExportRequest:
    """What the command line asked for (``cli_parser``'s ``export prometheus``)."""

    root: Path
    runs: tuple[str, ...]
    textfile: Path | None
    listen: ListenAddress | None
    once: bool
    interval: float = DEFAULT_INTERVAL_S


class GpuFeed:
    """This host's GPUs: NVML, opened once; where it cannot be, no GPU series and one line on stderr."""

    def __init__(self, err: TextIO, source: GpuSource | None = None) -> None:
        self.host = host_name()
        self._source = source
        if source is None:
            try:
                self._source = Nvml()
            except GpuUnavailable as e:
                print(f"shardtop: no GPU series: {e}", file=err, flush=True)

    def samples(self) -> list[Sample | None]:
        if self._source is None:
            return []
        gpus, uses = read_gpus(self._source)
        return gpu_samples(self.host, gpus, uses)


def scrape(runs: FollowedRuns, gpus: GpuFeed) -> str:
    """One scrape: every followed run as it stands now, then the GPUs."""
    samples: list[Sample | None] = []
    for followed, model in runs.refresh():
        samples += run_samples(followed.run.id, model, followed.findings(model))
    samples += gpus.samples()
    return render(samples)


@contextmanager
def _stopped_by_sigterm(stop: threading.Event) -> Iterator[None]:
    """SIGTERM (a service manager, ``kill``) ends the loop as Ctrl-C does, closing the server."""
    try:
        before = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    except ValueError:  # not the main thread: leave the signal as it is
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def export_prometheus(request: ExportRequest, err: TextIO, gpu_source: GpuSource | None = None) -> int:
    """Run the export until stopped (or once); ``OutputError`` and ``RunError`` for what the user can fix."""
    runs = FollowedRuns.of(request.root, request.runs)
    textfile = TextFile(request.textfile) if request.textfile is not None else None
    server = MetricsServer(request.listen) if request.listen is not None else None
    stop = threading.Event()
    try:
        gpus = GpuFeed(err, gpu_source)
        text = scrape(runs, gpus)
        if textfile is not None:
            textfile.check(text)
        if server is not None:
            server.publish(text)
            server.start()
            print(f"shardtop: serving http://{server.address}/metrics, every {request.interval:g} s; "
                  "Ctrl-C stops", file=err, flush=True)
        elif not request.once:
            print(f"shardtop: writing {textfile and textfile.path} every {request.interval:g} s; Ctrl-C stops",
                  file=err, flush=True)
        with _stopped_by_sigterm(stop):
            _loop(request, runs, gpus, textfile, server, stop, err)
    finally:
        if server is not None:
            server.close()
    return 0


def _finished(request: ExportRequest, server: MetricsServer | None, stop: threading.Event) -> bool:
    """Stopped, or ``once`` and done: written, and served where listening."""
    return stop.is_set() or (request.once and (server is None or server.served.is_set()))


def _loop(request: ExportRequest, runs: FollowedRuns, gpus: GpuFeed, textfile: TextFile | None,
          server: MetricsServer | None, stop: threading.Event, err: TextIO) -> None:
    said = ""
    while not _finished(request, server, stop):
        wake = server.served if request.once and server is not None else stop
        if wake.wait(request.interval):
            continue
        text = scrape(runs, gpus)
        if server is not None:
            server.publish(text)
        if textfile is not None:
            try:
                textfile.write(text)
                said = ""
            except OSError as e:
                if str(e) != said:  # said once until it works again, not every interval
                    said = str(e)
                    print(f"shardtop: cannot write {textfile.path}: {e.strerror or e}", file=err, flush=True)
