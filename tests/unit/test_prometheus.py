"""``shardtop export prometheus`` without a server: real recordings' figures in the text format, each the
same as the run's JSON report says; the GPUs as recorded NVML samples read; the outputs' checks; which
runs are followed.  A real Prometheus scraping a real run is tests/engines/test_prometheus_export.py.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import stat
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from shardtop.export import command
from shardtop.export.command import ExportRequest, export_prometheus, scrape
from shardtop.export.exposition import Gauge, render, sample
from shardtop.export.followed import KEPT_AFTER_END_S, FollowedRuns
from shardtop.export.gpu_metrics import gpu_samples, read_gpus
from shardtop.export.outputs import ListenAddress, MetricsServer, OutputError, TextFile, parse_listen
from shardtop.export.run_metrics import run_samples
from shardtop.gpus import GpuUnavailable
from shardtop.report import render_report
from shardtop.rundir.run_directory import RunDirectory
from tests.support.prometheus_text import Series, parse, value, values
from tests.support.recorded import copy_runs, live_copy, nvml_samples, recorded_h200
from tests.support.waiting import wait_until

KEPT_LOGITS = "h200-over-time/kept-logits"
"""One H200 rank, memory split by kind every step, out of memory at step 90."""
CPU_REHEARSAL = "cpu-rehearsal/fsdp2-mlp"
SIX_RANKS = "cpu-6ranks/zero3-linear"


def exported(path: Path) -> list[Series]:
    runs = FollowedRuns.of(path.parent, [str(path)])
    [(followed, model)] = runs.refresh()
    return parse(render(run_samples(followed.run.id, model, followed.findings(model))))


def report_of(path: Path) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(render_report(RunDirectory(path), "json"))
    return parsed


@pytest.mark.parametrize("name", [KEPT_LOGITS, CPU_REHEARSAL, SIX_RANKS])
def test_each_ranks_figures_are_the_reports(tmp_path: Path, name: str) -> None:
    path = copy_runs(tmp_path, name)[name]
    series, report = exported(path), report_of(path)
    run = {"run": path.name}
    assert value(series, "shardtop_run_state", **run, state=report["run"]["status"]) == 1
    assert sum(values(series, "shardtop_run_state", **run)) == 1
    assert value(series, "shardtop_run_info", **run, engine=report["engine"], world_size=report["world_size"]) == 1
    for r in report["ranks"]:
        rank = {**run, "rank": r["rank"], "hostname": r["host"], "world_size": report["world_size"]}
        assert value(series, "shardtop_rank_info", **rank, device=r["device"], pid=r["pid"], engine=r["engine"]) == 1
        assert value(series, "shardtop_rank_state", **rank, state=r["status"]) == 1
        assert sum(values(series, "shardtop_rank_state", **rank)) == 1
        assert value(series, "shardtop_rank_phase", **rank, phase=r["phase"]) == 1
        assert value(series, "shardtop_rank_step", **rank) == r["step"]
        for gauge, split in (("shardtop_rank_memory_bytes", r["memory_now"]),
                             ("shardtop_rank_memory_peak_bytes", r["memory_peak"])):
            by_kind = {**split["by_kind"], "unexplained": split["unexplained"]} if split else {}
            exported_kinds = {s.labels["kind"]: s.value for s in series
                              if s.name == gauge and s.labels["rank"] == str(r["rank"])}
            assert exported_kinds == {k: v for k, v in by_kind.items() if v is not None}
        allocator = r["allocator"]
        assert value(series, "shardtop_rank_allocated_bytes", **rank) == allocator["allocated"]
        assert value(series, "shardtop_rank_reserved_bytes", **rank) == allocator["reserved"]
        assert value(series, "shardtop_rank_allocator_peak_bytes", **rank) == allocator["peak"]
        assert value(series, "shardtop_rank_host_rss_bytes", **rank) == (r["host_rss"] or None)
    found = {sev: sum(1 for f in report["findings"] if f["severity"] == sev) for sev in ("error", "warning", "info")}
    assert {sev: value(series, "shardtop_run_findings", **run, severity=sev) for sev in found} == found
    codes = {s.labels["code"] for s in series if s.name == "shardtop_run_finding"}
    assert codes == {f["code"] for f in report["findings"]}


def test_an_oom_rank_says_out_of_memory_its_limit_and_what_filled_it(tmp_path: Path) -> None:
    path = copy_runs(tmp_path, KEPT_LOGITS)[KEPT_LOGITS]
    series, report = exported(path), report_of(path)
    rank = {"run": path.name, "rank": 0}
    assert value(series, "shardtop_rank_state", **rank, state="out of memory") == 1
    assert value(series, "shardtop_rank_memory_limit_bytes", **rank) == report["oom"]["limit"]
    kept = report["oom"]["memory"]["by_kind"]["kept"]
    assert value(series, "shardtop_rank_memory_bytes", **rank, kind="kept") == kept > 0
    assert value(series, "shardtop_run_finding", run=path.name, code="oom", severity="error") == 1


def test_the_gpus_are_what_nvml_read_with_the_labels_people_query() -> None:
    recorded = nvml_samples()[-1]
    gpus, uses = read_gpus(recorded_h200())
    series = parse(render(gpu_samples("gpu-node-3", gpus, uses)))
    for g in recorded:
        gpu = {"hostname": "gpu-node-3", "index": g.index, "uuid": g.uuid}
        assert value(series, "shardtop_gpu_memory_used_bytes", **gpu, devicename=g.name) == g.used
        assert value(series, "shardtop_gpu_memory_total_bytes", **gpu, devicename=g.name) == g.total
        assert {s.labels["pid"] for s in series if s.name == "shardtop_gpu_process_info" and
                s.labels["index"] == str(g.index)} == {str(p) for p in g.pids} != set()
    # the recording has no per-process memory: no series rather than a made-up figure
    assert values(series, "shardtop_gpu_process_memory_used_bytes") == []


def test_the_text_escapes_labels_and_help_and_writes_each_family_and_series_once() -> None:
    gauge = Gauge("shardtop_test_bytes", 'what a "test" holds\\ in two\nlines')
    odd = 'a "quoted" back\\slash\nand a newline'
    text = render([sample(gauge, 1, run=odd), sample(gauge, 2, run=odd), sample(gauge, 3.5, run="b"),
                   sample(gauge, None, run="c"), sample(Gauge("shardtop_other", "x"), 2**40)])
    lines = text.splitlines()
    assert lines[:2] == ['# HELP shardtop_test_bytes what a "test" holds\\\\ in two\\nlines',
                         "# TYPE shardtop_test_bytes gauge"]
    assert text.endswith("\n") and text.count("# TYPE") == 2 and len(lines) == 7
    series = parse(text)
    assert [(s.labels, s.value, s.timestamp) for s in series[:2]] == [
        ({"run": odd}, 1, None), ({"run": "b"}, 3.5, None)]
    assert "shardtop_other 1099511627776" in lines
    with pytest.raises(ValueError):
        Gauge("shardtop-bad", "x")


@pytest.mark.parametrize("text, host, port", [
    ("9400", "127.0.0.1", 9400), ("0.0.0.0:9400", "0.0.0.0", 9400), ("localhost:0", "localhost", 0),
    ("[::1]:9400", "::1", 9400),
])
def test_a_listen_address_is_loopback_unless_a_host_is_given(text: str, host: str, port: int) -> None:
    assert parse_listen(text) == ListenAddress(host, port)


@pytest.mark.parametrize("text, words", [
    ("abc", "expected [HOST:]PORT"), (":9400", "name the host"), ("70000", "from 0 to 65535"),
    ("::1:9400", "brackets"), ("host:", "expected [HOST:]PORT"),
])
def test_a_bad_listen_address_says_what_to_type(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=r"--listen") as caught:
        parse_listen(text)
    assert words in str(caught.value)


def test_the_textfile_is_replaced_whole_and_readable_by_the_collector(tmp_path: Path) -> None:
    target = tmp_path / "shardtop.prom"
    textfile = TextFile(target)
    textfile.check("a 1\n")
    textfile.write("b 2\n")
    assert target.read_text() == "b 2\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shardtop.prom"], "no temporary file left"


@pytest.mark.parametrize("where, words", [
    ("shardtop.txt", "--textfile {tmp}/shardtop.txt.prom"),
    ("", "is a directory"),
    ("missing/shardtop.prom", "no directory"),
])
def test_a_textfile_the_collector_cannot_read_says_what_to_type(tmp_path: Path, where: str, words: str) -> None:
    with pytest.raises(OutputError) as caught:
        TextFile(tmp_path / where if where else tmp_path)
    assert words.format(tmp=tmp_path) in str(caught.value)


def test_an_unwritable_textfile_is_said_at_the_first_write() -> None:
    textfile = TextFile(Path("/proc/shardtop.prom"))  # no one, root included, makes a file there
    with pytest.raises(OutputError, match=r"cannot write /proc/shardtop.prom: .*--textfile ./shardtop.prom"):
        textfile.check("a 1\n")


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def test_the_server_answers_metrics_and_nothing_else() -> None:
    server = MetricsServer(ListenAddress("127.0.0.1", 0))
    try:
        server.publish("shardtop_x 1\n")
        server.start()
        base = f"http://{server.address}"
        assert _get(base + "/metrics") == (200, "text/plain; version=0.0.4; charset=utf-8", "shardtop_x 1\n")
        assert server.served.wait(10)  # set by the server's thread once it has written the answer
        assert _get(base + "/")[0] == 404 and _get(base + "/metrics/x")[0] == 404
    finally:
        server.close()


def test_a_port_in_use_or_an_address_not_here_says_what_to_type() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OutputError, match=rf"127.0.0.1:{port}: the port is in use.*--listen 127.0.0.1:{port + 1}"):
            MetricsServer(ListenAddress("127.0.0.1", port))
    with pytest.raises(OutputError, match=r"not an address of this machine; try --listen 9400"):
        MetricsServer(ListenAddress("192.0.2.1", 9400))  # TEST-NET-1: never a local address
    with pytest.raises(OutputError, match=r"no such host"):
        MetricsServer(ListenAddress("no-such-host.invalid", 9400))


def test_unnamed_runs_are_followed_while_running_and_a_while_after_they_end(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    ended = copy_runs(root, SIX_RANKS)[SIX_RANKS]
    running = live_copy(root, CPU_REHEARSAL)
    now = [1000.0]
    runs = FollowedRuns(root, clock=lambda: now[0])
    assert [f.run.path for f, _ in runs.refresh()] == [running]
    assert ended not in [f.run.path for f, _ in runs.refresh()], "a run that had ended before is not exported"
    RunDirectory(running).write_exit(0, reason="finished", ending="finished")
    [(_, model)] = runs.refresh()
    assert model.status is not None and model.status.state == "finished"
    now[0] += KEPT_AFTER_END_S - 1
    assert len(runs.refresh()) == 1, "kept for a while, so a scrape sees how it ended"
    now[0] += 2
    assert runs.refresh() == []


def test_once_writes_one_scrape_of_the_runs_and_gpus_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "runs"
    live_copy(root, CPU_REHEARSAL)
    out = tmp_path / "textfiles"
    out.mkdir()
    err = io.StringIO()
    request = ExportRequest(root=root, runs=(), textfile=out / "shardtop.prom", listen=None, once=True)
    assert export_prometheus(request, err, gpu_source=recorded_h200()) == 0
    assert err.getvalue() == ""
    assert os.listdir(out) == ["shardtop.prom"]
    series = parse((out / "shardtop.prom").read_text())
    assert {s.name for s in series} >= {"shardtop_rank_step", "shardtop_gpu_memory_used_bytes"}

    def no_driver() -> None:
        raise GpuUnavailable("no NVIDIA driver: NVML Shared Library Not Found")

    monkeypatch.setattr(command, "Nvml", no_driver)
    feed = command.GpuFeed(err)
    assert err.getvalue() == "shardtop: no GPU series: no NVIDIA driver: NVML Shared Library Not Found\n"
    assert "shardtop_gpu" not in scrape(FollowedRuns(root), feed)
    assert err.getvalue().count("\n") == 1, "said once"


def test_once_while_listening_serves_one_scrape_then_returns(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    live_copy(root, CPU_REHEARSAL)
    err = io.StringIO()
    request = ExportRequest(root=root, runs=(), textfile=None, listen=ListenAddress("127.0.0.1", 0), once=True,
                            interval=0.1)
    returned: list[int] = []
    exporter = threading.Thread(target=lambda: returned.append(export_prometheus(request, err, recorded_h200())))
    exporter.start()
    try:
        wait_until(lambda: "serving" in err.getvalue(), 30, "the server to say its address")
        found = re.search(r"serving http://(127\.0\.0\.1:\d+)/metrics", err.getvalue())
        assert found is not None, err.getvalue()
        assert _get(f"http://{found.group(1)}/")[0] == 404, "a request elsewhere is not the scrape"
        status, _, text = _get(f"http://{found.group(1)}/metrics")
        assert status == 200 and value(parse(text), "shardtop_rank_step", rank=3) == 3
    finally:
        exporter.join(timeout=30)
    assert returned == [0] and not exporter.is_alive()
    with pytest.raises(OSError):
        _get(f"http://{found.group(1)}/metrics")
