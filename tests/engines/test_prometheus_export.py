"""``shardtop export prometheus`` read by the real thing: Debian's Prometheus scraping the ``/metrics`` of a
live CPU run (2 gloo ranks), then its HTTP API queried for the series, each set against the run's own JSON
report once the run was stopped; node_exporter's textfile collector reading the textfile; promtool's lint.

Debian's ``prometheus`` and ``prometheus-node-exporter`` packages must be installed (.ci/run installs
them): without them these tests fail and say so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Hello, Step
from shardtop.rundir.run_directory import RunDirectory, list_runs
from tests.support.cli import ROOT, report, shardtop
from tests.support.distributed import free_port
from tests.support.prometheus_text import parse, value
from tests.support.recorded import copy_runs
from tests.support.waiting import wait_until

INSTALL = "apt-get install -y prometheus prometheus-node-exporter (Debian's packages; .ci/run installs them)"


def binary(name: str) -> str:
    found = shutil.which(name)
    assert found is not None, f"{name} is not installed: {INSTALL}"
    return found


@contextmanager
def started(args: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A process of ours for the test's length, ended (by its pid) at the end."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text: str = answer.read().decode()
        return text


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    """Prometheus's HTTP API, ``/api/v1/query``: the instant vector's series (``metric``, ``value``)."""
    answer = json.loads(get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def one(prometheus: str, promql: str) -> float | None:
    found = query(prometheus, promql)
    assert len(found) <= 1, (promql, found)
    return float(found[0]["value"][1]) if found else None


def ready(url: str) -> bool:
    try:
        get(url)
        return True
    except OSError:
        return False


def stepping(runs_dir: Path) -> RunDirectory | None:
    runs = list_runs(runs_dir)
    if not runs:
        return None
    events, _ = read_all(runs[0].events_dir)
    return runs[0] if {e.rank for e in events if isinstance(e, Step)} == {0, 1} else None


def test_prometheus_scrapes_a_live_run_and_its_series_are_the_reports(runs_dir: Path, tmp_path: Path) -> None:
    prometheus_bin = binary("prometheus")
    env = {**os.environ, "SHARDTOP_RUNS_DIR": str(runs_dir), "PYTHONUNBUFFERED": "1"}
    exporter_port, prometheus_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: shardtop\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{exporter_port}']\n"
    )
    api = f"http://127.0.0.1:{prometheus_port}"
    launch = [sys.executable, "-m", "shardtop", "launch", "fsdp2-mlp", "--headless", "max_steps=100000"]
    export = [sys.executable, "-m", "shardtop", "export", "prometheus", "--listen", f"127.0.0.1:{exporter_port}",
              "--interval", "0.5"]
    serve = [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}", "--log.level=warn"]
    with started(launch, tmp_path / "launch.log", env), started(export, tmp_path / "export.log", env) as exporter, \
            started(serve, tmp_path / "prometheus.log"):
        wait_until(lambda: ready(f"{api}/-/ready"), 60, "Prometheus to be ready")
        wait_until(lambda: stepping(runs_dir), 90, "both ranks to finish a step")
        run = stepping(runs_dir)
        assert run is not None

        # while it runs: both ranks running and stepping, as scraped
        def live() -> bool:
            steps = query(api, f'shardtop_rank_step{{run="{run.id}"}} > 0')
            running = query(api, f'shardtop_rank_state{{run="{run.id}",state="running"}} == 1')
            return len(steps) == 2 and len(running) == 2
        wait_until(live, 30, "Prometheus to scrape both ranks stepping")
        assert one(api, 'up{job="shardtop"}') == 1
        assert one(api, f'shardtop_run_state{{run="{run.id}",state="running"}}') == 1

        stopped = shardtop("stop", run.id, "--grace", "20", runs_dir=runs_dir)
        assert stopped.returncode == 0, stopped.stderr
        wait_until(lambda: one(api, f'shardtop_run_state{{run="{run.id}",state="stopped"}}') == 1, 30,
                   "Prometheus to scrape the run stopped")

        # once stopped nothing moves: every series is the report's
        data = json.loads(report(run.path, "json"))
        hellos = {e.rank: e for e in read_all(run.events_dir)[0] if isinstance(e, Hello)}
        assert len(data["ranks"]) == 2
        for r in data["ranks"]:
            rank = f'run="{run.id}",rank="{r["rank"]}"'
            [info] = query(api, f"shardtop_rank_info{{{rank}}}")
            labels = info["metric"]
            assert (labels["hostname"], labels["device"], labels["pid"], labels["engine"]) == (
                r["host"], r["device"], str(r["pid"]), r["engine"])
            assert (labels["world_size"], labels["local_rank"]) == (str(data["world_size"]), str(r["rank"]))
            assert one(api, f'shardtop_rank_state{{{rank},state="{r["status"]}"}}') == 1
            assert sum(float(s["value"][1]) for s in query(api, f"shardtop_rank_state{{{rank}}}")) == 1
            assert one(api, f'shardtop_rank_phase{{{rank},phase="{r["phase"]}"}}') == 1
            assert one(api, f"shardtop_rank_step{{{rank}}}") == r["step"] > 0
            memory = query(api, f"shardtop_rank_memory_bytes{{{rank}}}")
            kinds = {s["metric"]["kind"]: float(s["value"][1]) for s in memory}
            assert kinds == {k: v for k, v in r["memory_now"]["by_kind"].items() if v is not None} != {}
            assert one(api, f"shardtop_rank_host_rss_bytes{{{rank}}}") == r["host_rss"]
            hello = hellos[r["rank"]]
            assert one(api, f"shardtop_rank_memory_limit_bytes{{{rank}}}") == (
                hello.host_memory_limit or hello.host_memory)
            assert r["allocator"]["allocated"] is None and query(api, f"shardtop_rank_allocated_bytes{{{rank}}}") == []
        for severity in ("error", "warning", "info"):
            count = sum(1 for f in data["findings"] if f["severity"] == severity)
            assert one(api, f'shardtop_run_findings{{run="{run.id}",severity="{severity}"}}') == count

        exporter.send_signal(signal.SIGTERM)
        assert exporter.wait(timeout=20) == 0, (tmp_path / "export.log").read_text()


def test_node_exporters_textfile_collector_reads_the_textfile(tmp_path: Path) -> None:
    node_exporter = binary("prometheus-node-exporter")
    name = "h200-over-time/kept-logits"
    run = copy_runs(tmp_path / "runs", name)[name]
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    done = shardtop("export", "prometheus", str(run), "--textfile", str(textfiles / "shardtop.prom"), "--once",
                    runs_dir=tmp_path / "runs")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and sorted(os.listdir(textfiles)) == ["shardtop.prom"]
    port = free_port()
    serve = [node_exporter, "--collector.disable-defaults", "--collector.textfile",
             f"--collector.textfile.directory={textfiles}", f"--web.listen-address=127.0.0.1:{port}"]
    with started(serve, tmp_path / "node_exporter.log"):
        wait_until(lambda: ready(f"http://127.0.0.1:{port}/metrics"), 30, "node_exporter to answer")
        series = parse(get(f"http://127.0.0.1:{port}/metrics"))
    assert value(series, "node_textfile_scrape_error") == 0
    data = json.loads(report(run, "json"))
    rank = {"run": run.name, "rank": 0}
    assert value(series, "shardtop_rank_step", **rank) == data["ranks"][0]["step"]
    assert value(series, "shardtop_rank_state", **rank, state="out of memory") == 1
    assert value(series, "shardtop_rank_allocator_peak_bytes", **rank) == data["ranks"][0]["allocator"]["peak"]


def test_promtool_finds_nothing_to_say_of_a_scrape(tmp_path: Path) -> None:
    promtool = binary("promtool")
    names = ["h200-over-time/kept-logits", "cpu-6ranks/zero3-linear", "cpu-rehearsal/fsdp2-mlp", "h200x2/zero3-linear"]
    runs = copy_runs(tmp_path / "runs", *names)
    target = tmp_path / "all.prom"
    done = shardtop("export", "prometheus", *map(str, runs.values()), "--textfile", str(target), "--once",
                    runs_dir=tmp_path / "runs")
    assert done.returncode == 0, done.stderr
    assert len({s.labels["run"] for s in parse(target.read_text()) if "run" in s.labels}) == len(names)
    with open(target, "rb") as scrape:
        lint = subprocess.run([promtool, "check", "metrics"], stdin=scrape, capture_output=True, text=True, timeout=60)
    assert (lint.returncode, lint.stdout + lint.stderr) == (0, "")


@pytest.mark.parametrize("args, words", [
    ((), "--textfile PATH.prom"),
    (("--listen", "abc"), "expected [HOST:]PORT"),
    (("--listen", ":9400"), "--listen 9400"),
    (("--listen", "192.0.2.1:9400"), "not an address of this machine"),
    (("--textfile", "metrics.txt"), "--textfile metrics.txt.prom"),
    (("--textfile", "/no/such/dir/shardtop.prom"), "no directory /no/such/dir"),
    (("--textfile", "/proc/shardtop.prom"), "cannot write /proc/shardtop.prom"),
    (("--textfile", "x.prom", "no-such-run"), "no run"),
])
def test_bad_input_exits_2_and_says_what_to_type(tmp_path: Path, args: tuple[str, ...], words: str) -> None:
    copy_runs(tmp_path / "runs", "cpu-rehearsal/fsdp2-mlp")
    done = shardtop("export", "prometheus", *args, runs_dir=tmp_path / "runs")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert words in done.stderr, done.stderr
    assert not (ROOT / "x.prom").exists()


def test_a_port_in_use_exits_2_and_names_another(tmp_path: Path) -> None:
    port = free_port()
    with started([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)], tmp_path / "http.log"):
        wait_until(lambda: ready(f"http://127.0.0.1:{port}/"), 30, "the other server to listen")
        done = shardtop("export", "prometheus", "--listen", str(port), runs_dir=tmp_path / "runs")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"127.0.0.1:{port}: the port is in use" in done.stderr and f"--listen 127.0.0.1:{port + 1}" in done.stderr


@pytest.mark.parametrize("args, words", [(("export",), "required: prometheus"),
                                         (("export", "prom"), "choose from 'prometheus'")])
def test_a_missing_or_mistyped_format_names_prometheus(tmp_path: Path, args: tuple[str, ...], words: str) -> None:
    done = shardtop(*args, runs_dir=tmp_path / "runs")
    assert done.returncode == 2 and words in done.stderr, done.stderr


def test_an_export_imports_no_training_library_and_no_textual(tmp_path: Path) -> None:
    name = "h200-over-time/kept-logits"
    run = copy_runs(tmp_path / "runs", name)[name]
    args = ["export", "prometheus", str(run), "--textfile", str(tmp_path / "a.prom"), "--once"]
    script = (
        "import json, sys\n"
        "from shardtop.cli import main\n"
        f"assert main({args!r}) == 0\n"
        "print(json.dumps(sorted(n for n in ('torch', 'lightning', 'deepspeed', 'textual') if n in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []
    assert "shardtop_rank_step" in (tmp_path / "a.prom").read_text()
