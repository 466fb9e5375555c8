"""How a split's kinds and places read in the report: the kinds largest first, then where the script made its
tensors, where the kept ones were made and where the unexplained bytes were allocated."""

from __future__ import annotations

import msgspec

from shardtop.read.memory_kinds import sites_sentence, split_sentence
from shardtop.read.other_parts import other_shares
from shardtop.rundir.memory_figures import AllocationSite, MemoryKinds, MemorySplit, OtherParts

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


def test_other_is_said_by_part_with_its_places() -> None:
    parts = OtherParts(backward=600 * MiB, output=300 * MiB, buffers=100 * MiB)
    split = MemorySplit(
        allocated=2000 * MiB,
        by_kind=MemoryKinds(params=1000 * MiB, other=1000 * MiB),
        unexplained=0,
        other_at=[AllocationSite(where="", bytes=600 * MiB, part="backward"),
                  AllocationSite(where="model.py:80 in forward", bytes=300 * MiB, part="output"),
                  AllocationSite(where="model.py:20 in __init__", bytes=100 * MiB, part="buffers")],
        other_parts=parts,
    )
    assert split_sentence(split) == (
        "1.95 GiB allocated: 1000 MiB parameters, 1000 MiB other (600 MiB gradients in flight in the backward, "
        "300 MiB the model's output, 100 MiB module buffers)"
    )
    said = sites_sentence(split)
    assert said is not None and said.startswith("other: 600 MiB made by autograd in the backward (gradients in flight")
    assert "; 300 MiB the model's output, still held (a language model's logits, its head's output), at " in said
    assert said.endswith("; 100 MiB module buffers, at model.py:20 in __init__")


def test_an_older_recordings_other_is_read_from_its_places_and_what_they_do_not_tell_is_not_named() -> None:
    """Recorded before the parts were told: a place with no Python frame is the backward's, one in a forward a
    forward's; a place that tells neither is said as a place, and bytes no place was kept for are not said."""
    split = MemorySplit(
        allocated=2000 * MiB,
        by_kind=MemoryKinds(params=1000 * MiB, other=1000 * MiB),
        unexplained=0,
        other_at=[AllocationSite(where="", bytes=500 * MiB),
                  AllocationSite(where="train.py:70 in main", bytes=200 * MiB),
                  AllocationSite(where="model.py:80 in forward", bytes=100 * MiB)],
    )
    assert [(s.part, s.bytes) for s in other_shares(split)] == [
        ("backward", 500 * MiB), (None, 400 * MiB), ("forward", 100 * MiB)
    ]
    said = sites_sentence(split)
    assert said is not None and said.startswith("other: 500 MiB made by autograd in the backward (")
    assert "; 200 MiB at train.py:70 in main; 100 MiB made in a forward and saved for no backward" in said
    placeless = msgspec.structs.replace(split, other_at=[])
    assert sites_sentence(placeless) is None and split_sentence(placeless).endswith("1000 MiB other")
