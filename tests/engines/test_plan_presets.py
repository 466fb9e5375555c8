"""Plans of every preset against real 2-process CPU runs: per rank, within 2 %.

The runs are the ones ``test_diagnose.py`` and ``test_report.py`` read
(``real_runs.STORIES``: ``shardtop launch PRESET accelerator=cpu --headless
max_steps=2``), made once per session.  Parameters, gradients and optimizer
state come from each rank's last ``Shards`` event.  Raw loops (and
manual-placement's one process) clear their
gradients before that snapshot and ZeRO-3 keeps them in its own buffer, so
for those presets the gradients are measured by ``plan_workers.py`` on the
same programs, after one backward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardtop.plan import preset_strategies
from shardtop.rundir.event_files import read_all
from shardtop.rundir.events import Shards
from shardtop.trace import recipes
from shardtop.trace.presets import plan_config
from shardtop.units import ceil_div
from tests.diagnose_scripts.real_runs import report_json, runs_base, story
from tests.support.distributed import run_ranks

PRESETS = ("fsdp-not-sharding", "fsdp-auto-wrap", "zero3-linear", "zero3-linear-fixed", "fsdp2-mlp", "ddp-baseline",
           "manual-placement")
RAW_GRADS = {"fsdp-not-sharding": [], "fsdp-auto-wrap": [], "zero3-linear": ["model.n_layers=16"],
             "zero3-linear-fixed": ["model.n_layers=16"], "manual-placement": []}
"""Presets whose gradients the snapshots do not carry, with the overrides their runs in STORIES use."""
TOLERANCE = 0.02


@pytest.fixture(scope="session")
def real_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return runs_base(tmp_path_factory)


@pytest.fixture(scope="session")
def raw_grads(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, int]]:
    """Gradient bytes per rank of the raw-engine presets, one backward each, on 2 gloo ranks."""
    presets = [[name, *overrides] for name, overrides in RAW_GRADS.items()]
    return run_ranks(
        "tests.support.plan_workers:raw_preset_grads", 2, tmp_path_factory.mktemp("plan-grads"), presets=presets
    )


def _last_shards(run_path: Path) -> dict[int, Shards]:
    events, _ = read_all(run_path / "events")
    last: dict[int, Shards] = {}
    for e in events:
        if isinstance(e, Shards):
            last[e.rank] = e
    return last


def _close(planned: int, measured: int) -> bool:
    return abs(planned - measured) <= TOLERANCE * measured


@pytest.mark.parametrize("preset", PRESETS)
def test_planned_model_states_per_rank_match_a_real_cpu_run(
    preset: str, real_base: Path, raw_grads: list[dict[str, int]]
) -> None:
    real = story(real_base, preset)
    config: dict[str, Any] = dict(real.run.read_meta().config.settings)
    plan = plan_config(config, devices=int(config["devices"]), accelerator="cpu", gpu=None)
    planned = plan.asked.per_rank
    last = _last_shards(real.path)
    assert len(last) == int(config["world_size"]), real.describe()
    for rank, shards in sorted(last.items()):
        assert shards.stage == "step", real.describe()
        # ZeRO-3 keeps small parameters whole next to the partitions; the snapshot counts them apart
        params = sum(shards.bytes) + int(shards.info.get("gathered_bytes", 0) or 0)
        assert _close(planned.params, params), (rank, planned.params, params)
        assert shards.optim_bytes is not None
        assert _close(planned.optimizer, sum(shards.optim_bytes)), (rank, planned.optimizer, sum(shards.optim_bytes))
        if preset in RAW_GRADS:
            grads = raw_grads[rank][preset]
        else:
            assert shards.grad_bytes is not None, real.describe()
            grads = sum(shards.grad_bytes)
        assert _close(planned.grads, grads), (rank, planned.grads, grads)


ADAMW_BYTES = 4 + 8
"""Per element of the rank's partition: ZeRO's fp32 master copy and AdamW's two fp32 moments."""
ADAM_STEPS = 1024
"""Room for Adam's step counters, a few 4-byte tensors, beside the state in the census."""


def test_the_offload_keys_reach_deepspeed_and_the_state_stays_on_a_cpu_rank(real_base: Path) -> None:
    """``zero.offload_optimizer=cpu zero.offload_param=cpu`` on 2 gloo processes: DeepSpeed's engine offloads both,
    every parameter partition is held offloaded, and the rank holds its whole share of the optimizer's state
    still (a CPU rank's host memory is its own): by module, by kind, and as the plan made at set-up says."""
    real = story(real_base, "zero3-linear-fixed-offloaded")
    report = report_json(real)
    assert (report["info"]["offload_optimizer"], report["info"]["offload_param"]) == ("cpu", "cpu"), real.describe()
    assert report["step"] == 2, real.describe()
    states = ceil_div(report["model"]["params"], 2) * ADAMW_BYTES
    for rank in report["ranks"]:
        assert rank["status"] == "finished", real.describe()
        assert rank["optim_bytes"] == states
        assert states <= rank["memory_now"]["by_kind"]["optimizer"] <= states + ADAM_STEPS
    for planned in report["plan"]["per_rank"]:
        assert planned["predicted"]["optimizer"] == planned["measured"]["optimizer"] == states
    for shards in _last_shards(real.path).values():
        held = {shards.states[s] for s, numel in zip(shards.state, shards.bytes, strict=True) if numel}
        assert held == {"offloaded"}, held


def test_on_gpus_lightnings_strategy_is_given_the_offload_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the program hands Lightning on GPUs (no GPU is needed to build the strategy): DeepSpeed's sections,
    and leave to step torch's AdamW on the offloaded state; without the keys, Lightning's own stage 3."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from shardtop.config import resolve
    from shardtop.runner.context import RankContext
    from shardtop.runner.programs.zero3_linear import lightning_strategy

    def config(*offload: tuple[str, str]) -> dict[str, Any]:
        ctx = RankContext(Path("unused"), 0, 6, "cuda", resolve("zero3-linear-fixed", list(offload)))
        made: dict[str, Any] = lightning_strategy(ctx).config
        return made

    both = config(("zero.offload_optimizer", "cpu"), ("zero.offload_param", "cpu"))
    zero = both["zero_optimization"]
    assert (zero["stage"], zero["offload_optimizer"]["device"], zero["offload_param"]["device"]) == (3, "cpu", "cpu")
    assert both["zero_force_ds_cpu_optimizer"] is False
    plain = config()
    assert "offload_optimizer" not in plain["zero_optimization"] and "offload_param" not in plain["zero_optimization"]
    assert "zero_force_ds_cpu_optimizer" not in plain


def test_the_recipes_name_the_modules_the_programs_wrap_and_place() -> None:
    from shardtop.runner.programs import PROGRAMS, fsdp_story, manual_placement

    assert preset_strategies.HAND_WRAPPED == fsdp_story.HAND_WRAPPED
    assert preset_strategies.FIRST_HALF == manual_placement.FIRST_HALF
    assert preset_strategies.SECOND_HALF == manual_placement.SECOND_HALF
    assert set(recipes.RECIPES) == set(preset_strategies.PRESET_STRATEGIES) == set(PROGRAMS)
