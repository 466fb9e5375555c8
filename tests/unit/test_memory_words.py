"""How a split's kinds and places read in the report: the kinds largest first, then where the script made its
tensors, where the kept ones were made and where the unexplained bytes were allocated."""

from __future__ import annotations

from shardtop.read.memory_kinds import sites_sentence, split_sentence
from shardtop.rundir.memory_figures import AllocationSite, MemoryKinds, MemorySplit

MiB = 1 << 20


def _split(unexplained: int, **by_kind: int) -> MemorySplit:
    return MemorySplit(
        allocated=sum(by_kind.values()) + unexplained,
        by_kind=MemoryKinds(**by_kind),
        unexplained=unexplained,
        unexplained_at=[AllocationSite(where="deepspeed/runtime/utils.py:812 in pad_buffer", bytes=unexplained)],
        script_at=[AllocationSite(where="train.py:40 in make_mask", bytes=by_kind.get("script", 0))],
        kept_at=[AllocationSite(where="train.py:61 in main", bytes=by_kind.get("kept", 0))],
    )


def test_the_places_of_the_scripts_the_kept_and_the_unexplained_bytes_are_said() -> None:
    split = _split(12 * MiB, params=64 * MiB, kept=732 * MiB, script=16 * MiB)
    assert split_sentence(split) == (
        "824 MiB allocated: 732 MiB kept from earlier steps, 64 MiB parameters, 16 MiB made by the script, "
        "12 MiB unexplained"
    )
    assert sites_sentence(split) == (
        "made by the script: 16 MiB at train.py:40 in make_mask; kept from earlier steps, made 732 MiB at "
        "train.py:61 in main; unexplained bytes allocated 12 MiB at deepspeed/runtime/utils.py:812 in pad_buffer"
    )


def test_places_of_a_few_bytes_are_not_said() -> None:
    """Under 1 % of the split a place would read as a problem: a loss scaler's few bytes are not one."""
    split = _split(3 * MiB, params=4096 * MiB, kept=MiB, script=2 * MiB)
    assert sites_sentence(split) is None
