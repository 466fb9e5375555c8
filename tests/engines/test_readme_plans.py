"""The plans the README and docs/plan.md quote, made as a user makes them: ``shardtop plan ... --format json``.

Story 2 at its GPU size on six 16 GiB cards: as asked it runs out at set-up, every rank holding the whole
fp32 model; fixed it runs out at the first optimizer step, and optimizer offload is the cheapest change
that fits.  The README's GPU-sized example (story 2 fixed at 4000 layers on two ranks) planned for this
machine without a GPU: what its two CPU processes would need.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardtop.units import GiB, format_bytes
from tests.support.cli import shardtop

STORY2_LAYERS = 18_000
LINEAR_BYTES = 512 * 512 * 4 + 512 * 4
"""One ``Linear(512, 512)`` in fp32, weight and bias."""


def plan(tmp_path: Path, *words: str) -> dict[str, Any]:
    done = shardtop("plan", *words, "--format", "json", runs_dir=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def option(result: dict[str, Any], strategy: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [o for o in result["options"] if o["strategy"] == strategy]
    assert len(found) == 1, [o["strategy"] for o in result["options"]]
    return found[0]


def test_story_2_as_asked_on_six_16_gib_cards_runs_out_at_set_up_holding_the_whole_model(tmp_path: Path) -> None:
    result = plan(tmp_path, "zero3-linear", "devices=6", "gpu=16GiB")
    asked = option(result, result["asked"])
    assert asked["built_whole"] is True and asked["runs_out_at"] == "set-up"
    whole = STORY2_LAYERS * LINEAR_BYTES
    assert asked["per_rank"]["phases"]["setup"] >= whole and format_bytes(whole) == "17.6 GiB"


def test_story_2_fixed_on_six_16_gib_cards_needs_21_gib_and_fits_with_optimizer_offload(tmp_path: Path) -> None:
    result = plan(tmp_path, "zero3-linear-fixed", "devices=6", "gpu=16GiB")
    verdict = result["verdict"]
    assert verdict["fits"] is False and verdict["runs_out_at"] == "optimizer step"
    assert format_bytes(option(result, result["asked"])["per_rank"]["peak"]) == "21.4 GiB"
    assert verdict["change"] == "ZeRO-3, fp32, optimizer offload"
    assert format_bytes(option(result, verdict["change"])["per_rank"]["peak"]) == "7.96 GiB"


def test_the_gpu_sized_example_would_need_31_gib_of_a_cpu_host(tmp_path: Path) -> None:
    """Planned for this machine (no GPU): two CPU processes at the size asked, not the preset's CPU size."""
    result = plan(tmp_path, "zero3-linear-fixed", "devices=2", "model.n_layers=4000", "gpu_mem_limit=15GiB",
                  "accelerator=cpu")
    assert result["accelerator"] == "cpu" and result["devices"] == 2
    peak = option(result, result["asked"])["per_rank"]["peak"]
    assert round(2 * peak / GiB) == 31, format_bytes(2 * peak)


def test_story_2_fixed_with_the_presets_optimizer_offload_key_runs_what_the_plan_offered(tmp_path: Path) -> None:
    result = plan(tmp_path, "zero3-linear-fixed", "devices=6", "gpu=16GiB", "zero.offload_optimizer=cpu")
    assert result["asked"] == "ZeRO-3, fp32, optimizer offload" and result["verdict"]["fits"] is True
    asked = option(result, result["asked"])
    assert format_bytes(asked["per_rank"]["peak"]) == "7.96 GiB" and asked["per_rank"]["optimizer"] == 0


def test_story_2_fixed_with_both_offloads_at_micro_batch_272_keeps_off_the_gpu_what_the_host_holds(
    tmp_path: Path,
) -> None:
    """docs/plan.md: the set-up fit rehearsed first on six 16 GiB cards.  Its GPU peak is activations, gathered
    parameters and the reduce bucket; the optimizer state, the gradients and the partitions are host memory."""
    result = plan(tmp_path, "zero3-linear-fixed", "devices=6", "gpu=16GiB", "batch_size=272",
                  "zero.offload_optimizer=cpu", "zero.offload_param=cpu")
    per_rank = option(result, result["asked"])["per_rank"]
    assert (per_rank["optimizer"], per_rank["grads"]) == (0, 0)
    assert format_bytes(per_rank["peak"]) == "14.1 GiB" and format_bytes(per_rank["activations"]) == "9.34 GiB"
    assert format_bytes(per_rank["host"]) == "17.6 GiB"
    assert "Offloaded to host memory: 17.6 GiB per rank" in " ".join(result["verdict"]["text"])
