"""``RunConfig.parse``: ``run.json``'s config read once, a field of the wrong shape read as missing."""

from __future__ import annotations

from shardtop.rundir.run_config import RehearsalConfig, RunConfig


def test_a_preset_config_reads_its_fields() -> None:
    raw = {"program": "zero3-linear", "preset": "zero3-linear", "world_size": 2, "devices": 2,
           "accelerator": "cuda", "gpu_mem_limit": 15 * 2**30, "model": {"n_layers": 4}}
    config = RunConfig.parse(raw)
    assert (config.program, config.preset, config.world_size, config.devices) == ("zero3-linear",) * 2 + (2, 2)
    assert config.accelerator == "cuda" and config.gpu_mem_limit == 15 * 2**30 and config.rehearsal is None
    assert config.settings["model"] == {"n_layers": 4}
    assert config.rank_batches == [[0, 1]] and config.first_rank == 0


def test_fields_of_the_wrong_shape_read_as_missing() -> None:
    config = RunConfig.parse({"program": 3, "world_size": "2", "devices": True, "accelerator": "tpu",
                              "gpu_mem_limit": "15GiB", "rehearsal": {"world_size": 6, "ranks": "0"}})
    assert config == RunConfig(settings=config.settings)
    assert RunConfig.parse(["not", "an", "object"]) == RunConfig()


def test_a_rehearsal_starts_its_ranks_one_by_one() -> None:
    config = RunConfig.parse({"world_size": 6, "rehearsal": {"world_size": 6, "ranks": [3, 0, 9, True], "on": "CPU"}})
    assert config.rehearsal == RehearsalConfig(world_size=6, ranks=(3, 0), on="CPU")
    assert config.rank_batches == [[3], [0]] and config.first_rank == 3
