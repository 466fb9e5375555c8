"""``shardtop fit`` on real processes: the largest micro-batch it reports under a memory cap is where real
multi-process gloo runs draw the line.  Batch B, run as the pick's own command says, finishes its steps on
both ranks; batch B + 1 runs out of memory.

The suite runs a torchrun FSDP2 script, fitted once, its answer checked by two real two-rank runs under
the same cap; both runs of the pair go at once (each rank has its own cap; memory does not depend on what
else runs).  A preset's fit runs in the suite through the launch prompt (``test_tui_fit.py``).  The whole
matrix — presets (a preset exposes only its batch, so one set-up) at two caps each against real runs, a
second cap for the script, the HF Trainer script with its two set-ups (activation checkpointing off and
on) — takes about nine minutes on two cores, past what the suite may spend: ``SHARDTOP_FIT_MATRIX=1``
runs it (its figures of 2026-12-06 are in bench/RESULTS.md).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardtop.read.run_model import RunModel
from shardtop.read.whole_run import read_run
from shardtop.rundir.run_directory import list_runs
from tests.support.cli import ROOT, shardtop

CPU = {"CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"}
MATRIX = os.environ.get("SHARDTOP_FIT_MATRIX") == "1"
on_request = pytest.mark.skipif(not MATRIX, reason="the whole matrix takes minutes: SHARDTOP_FIT_MATRIX=1 runs it")
HF_SCRIPT = ["tests/own_scripts/fit_hf_trainer.py", "--use_cpu", "--report_to", "none", "--save_strategy", "no",
             "--vocab", "8192", "--seq", "128"]


@dataclass(frozen=True)
class Fitted:
    data: dict[str, Any]
    progress: str
    runs: Path


def fit(runs: Path, *words: str) -> Fitted:
    done = shardtop("fit", "--format", "json", *words, runs_dir=runs, timeout=900, env=CPU)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return Fitted(json.loads(done.stdout), done.stderr, runs)


@dataclass(frozen=True)
class Real:
    """A real two-rank run, as ``shardtop launch`` or ``shardtop run`` left it."""

    model: RunModel

    @property
    def finished_its_steps(self) -> bool:
        ranks = self.model.ranks
        return len(ranks) == 2 and all(r.oom is None and r.state.step >= 2 for r in ranks)

    @property
    def ran_out_of_memory(self) -> bool:
        return any(r.oom is not None for r in self.model.ranks)

    def __repr__(self) -> str:
        return f"{self.model.status_text}: " + ", ".join(
            f"rank {r.rank} {r.status.words}, step {r.state.step}" for r in self.model.ranks)


def real_runs(commands: list[list[str]], runs: Path) -> list[Real]:
    """Each ``shardtop`` command line run at once, each into a runs directory of its own."""
    started = []
    for words in commands:
        where = Path(tempfile.mkdtemp(prefix="real-", dir=runs))
        env = {**os.environ, **CPU, "SHARDTOP_RUNS_DIR": str(where), "PYTHONUNBUFFERED": "1"}
        started.append((where, subprocess.Popen([sys.executable, "-m", "shardtop", *words], cwd=ROOT, env=env,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    out = []
    for where, proc in started:
        _, err = proc.communicate(timeout=600)
        made = list_runs(where)
        assert len(made) == 1, err[-3000:]
        out.append(Real(read_run(made[0])))
    return out


def with_batch(words: list[str], old: str, new: str) -> list[str]:
    assert words.count(old) == 1, (words, old)
    return [new if w == old else w for w in words]


def assert_the_line_holds(fitted: Fitted, setup: dict[str, Any], pair: list[list[str]]) -> None:
    batch = setup["largest_batch"]
    assert setup["boundary_proven"] and setup["first_out_of_memory"] == batch + 1, setup
    fits, over = real_runs(pair, fitted.runs)
    assert fits.finished_its_steps, f"batch {batch}, as fit says, finishes: {fits!r}"
    assert over.ran_out_of_memory, f"batch {batch + 1} runs out of memory: {over!r}"


def assert_searched_from_the_plan(fitted: Fitted) -> None:
    """The first rehearsal is at the plan's batch; each is a run of rank 0 and the last rank (rank 1 of 2),
    unless rank 0 ran out of memory first; the progress said each on stderr."""
    for setup in fitted.data["configurations"]:
        trials = setup["trials"]
        assert trials and trials[0]["batch"] == setup["plan"]["largest_batch"], setup
        for trial in trials:
            meta = json.loads((Path(trial["run_path"]) / "run.json").read_text())
            assert meta["config"]["rehearsal"] == {"world_size": 2, "ranks": [0, 1], "on": "CPU"}
            assert [r["rank"] for r in trial["ranks"]] in ([0, 1], [0]), trial
        assert all(f"rehearsing micro-batch {t['batch']} (" in fitted.progress for t in trials)
    spent = re.compile(r"^fit \[\d+:\d\d of 10:00\]: \[1/\d+\] ", flags=re.MULTILINE)
    assert spent.search(fitted.progress), "each line says the time spent of the budget"


# -- a preset --------------------------------------------------------------------------------------


PRESET = ["fsdp-auto-wrap", "model.image=128"]
"""FSDP1 on gloo; 128-pixel images make a sample about 10 MB, far more than a real run and its rehearsal
differ by (gloo's own buffers)."""


@pytest.fixture(scope="module")
def preset_fit(tmp_path_factory: pytest.TempPathFactory) -> Fitted:
    return fit(tmp_path_factory.mktemp("fit-preset"), *PRESET, "devices=2", "gpu=128MiB")


@on_request
@pytest.mark.timeout(900)
def test_a_presets_largest_batch_is_where_real_runs_draw_the_line(preset_fit: Fitted) -> None:
    data = preset_fit.data
    assert_searched_from_the_plan(preset_fit)
    assert [k["kind"] for k in data["knobs"] if k["found"]] == ["micro-batch", "steps"]
    (setup,) = data["configurations"]
    pick = data["pick"]
    batch = pick["batch"]
    assert pick["changes"] == [f"batch_size={batch}"] and setup["largest_batch"] == batch
    use = shlex.split(pick["use"])
    assert use == ["shardtop", "launch", *PRESET, "devices=2", f"batch_size={batch}"]
    real = [*use[1:], "gpu_mem_limit=128MiB", "max_steps=2", "--headless"]
    assert_the_line_holds(preset_fit, setup, [real, with_batch(real, f"batch_size={batch}", f"batch_size={batch + 1}")])
    assert 0 < setup["peak_share"] <= 1 and setup["step_seconds"] > 0


# -- a torchrun FSDP2 script ---------------------------------------------------------------------


SCRIPT = ["torchrun", "--nproc_per_node", "2", "tests/own_scripts/fit_fsdp2.py", "--batch-size", "4", "--seq", "256",
          "--steps", "2"]


@pytest.fixture(scope="module")
def script_fit(tmp_path_factory: pytest.TempPathFactory) -> Fitted:
    return fit(tmp_path_factory.mktemp("fit-script"), "devices=2", "gpu=200MiB", "--", *SCRIPT)


@pytest.mark.timeout(900)
def test_a_torchrun_scripts_largest_batch_is_where_real_runs_draw_the_line(script_fit: Fitted) -> None:
    data = script_fit.data
    assert_searched_from_the_plan(script_fit)
    knobs = {k["kind"]: k for k in data["knobs"]}
    assert knobs["micro-batch"]["where"] == "--batch-size" and not knobs["sharding"]["found"]
    (setup,) = data["configurations"]
    batch = data["pick"]["batch"]
    use = shlex.split(data["pick"]["use"])
    assert use == with_batch(SCRIPT, "4", str(batch))
    real = ["run", "--gpu-mem-limit", "200MiB", "--headless", "--", *use]
    assert_the_line_holds(script_fit, setup, [real, with_batch(real, str(batch), str(batch + 1))])


# -- the whole matrix, on request --------------------------------------------------------------------


@on_request
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("preset", "cap"), [(["fsdp-auto-wrap", "model.image=128"], "96MiB"),
                                             (["ddp-baseline", "model.image=128"], "128MiB"),
                                             (["ddp-baseline", "model.image=128"], "96MiB")])
def test_more_presets_and_caps(preset: list[str], cap: str, tmp_path: Path) -> None:
    fitted = fit(tmp_path, *preset, "devices=2", f"gpu={cap}")
    assert_searched_from_the_plan(fitted)
    (setup,) = fitted.data["configurations"]
    batch = setup["largest_batch"]
    real = ["launch", *preset, "devices=2", f"batch_size={batch}", f"gpu_mem_limit={cap}", "max_steps=2", "--headless"]
    assert_the_line_holds(fitted, setup, [real, with_batch(real, f"batch_size={batch}", f"batch_size={batch + 1}")])


@on_request
@pytest.mark.timeout(1800)
def test_a_second_cap_for_the_script(tmp_path: Path) -> None:
    fitted = fit(tmp_path, "devices=2", "gpu=300MiB", "--", *SCRIPT)
    (setup,) = fitted.data["configurations"]
    batch = setup["largest_batch"]
    real = ["run", "--gpu-mem-limit", "300MiB", "--headless", "--", *with_batch(SCRIPT, "4", str(batch))]
    assert_the_line_holds(fitted, setup, [real, with_batch(real, str(batch), str(batch + 1))])


@on_request
@pytest.mark.timeout(1800)
def test_an_hf_trainer_scripts_two_set_ups(tmp_path: Path) -> None:
    """Activation checkpointing off (as given) and on (``--gradient_checkpointing true`` added): each set-up's
    largest batch, each confirmed by real runs of the command fit would run for it."""
    out = tmp_path / "out"
    command = ["torchrun", "--nproc_per_node", "2", *HF_SCRIPT, "--output_dir", str(out),
               "--per_device_train_batch_size", "4", "--max_steps", "2"]
    fitted = fit(tmp_path, "devices=2", "gpu=200MiB", "--", *command)
    assert_searched_from_the_plan(fitted)
    setups = {s["activation_checkpointing"]: s for s in fitted.data["configurations"]}
    assert set(setups) == {False, True}
    for checkpointing, setup in setups.items():
        batch = setup["largest_batch"]
        words = with_batch(command, "4", str(batch)) + (["--gradient_checkpointing", "true"] if checkpointing else [])
        real = ["run", "--gpu-mem-limit", "200MiB", "--headless", "--", *words]
        assert_the_line_holds(fitted, setup, [real, with_batch(real, str(batch), str(batch + 1))])
