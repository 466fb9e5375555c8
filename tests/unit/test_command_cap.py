"""``gpu_mem_limit`` for a user's command (``shardtop run --gpu-mem-limit``, fit's rehearsals): the cap each
rank gets from its environment, on a GPU through the CUDA allocator's own setting, which only a torch that
takes it is given (an older one would refuse the setting and every rank with it)."""

from __future__ import annotations

from shardtop.own_job.mem_cap import cap_environment
from shardtop.units import GiB


def test_a_gpu_rank_gets_its_share_of_the_card_from_the_allocators_setting() -> None:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    why = cap_environment(env, 16 * GiB, on_gpu=True, gpu_total=lambda: 64 * GiB, torch=lambda: (2, 13))
    assert why == ""
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True,per_process_memory_fraction:0.250000"
    assert env["SHARDTOP_MEM_LIMIT"] == str(16 * GiB)


def test_an_older_torch_runs_uncapped_and_is_told_why() -> None:
    env: dict[str, str] = {}
    why = cap_environment(env, 16 * GiB, on_gpu=True, gpu_total=lambda: 64 * GiB, torch=lambda: (2, 9))
    assert "torch 2.9" in why and "runs without the cap" in why
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env


def test_a_cap_at_or_above_the_card_caps_nothing() -> None:
    env: dict[str, str] = {}
    assert cap_environment(env, 80 * GiB, on_gpu=True, gpu_total=lambda: 64 * GiB, torch=lambda: (2, 13)) == ""
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
