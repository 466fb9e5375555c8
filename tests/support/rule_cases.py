"""Which real runs show each rule, and which come close without showing it, for the rules whose runs live
outside tests/engines/test_diagnose.py (that file checks that every rule has its runs)."""

from __future__ import annotations

MORE_RULE_CASES: dict[str, tuple[str, list[str]]] = {
    "fsdp2-not-resharded": ("fsdp2-layers-own-roots", ["fsdp2-root-forward", "fsdp2-hybrid-1x2"]),
    "optimizer-before-wrap": ("fsdp2-optimizer-before-wrap", ["ddp-optimizer-before-wrap", "fsdp2-root-forward"]),
    "fsdp-frozen-and-trainable-in-one-unit": ("fsdp1-lora-one-unit", ["fsdp1-lora-split"]),
    "fsdp-hybrid-shard": ("fsdp2-hybrid-2x1", ["fsdp2-hybrid-1x2"]),
    "zero3-persistence-threshold": ("zero3-small-layers", ["zero3-no-persistence"]),
    "zero12-replicated-params": ("zero2-frozen-backbone", ["zero2-full-finetune"]),
    "host-memory-whole-model-per-rank": ("fsdp2-whole-on-every-rank", ["fsdp2-meta-init"]),
}
"""tests/engines/test_rules_more.py: each rule, the run that shows it, and runs that come as close without
showing it."""

MORE_GPU_ONLY = {
    "allocator-fragmentation": "the allocator's reserved and allocated bytes at a CUDA OOM",
    "memory-outside-pytorch": "NVML's reading of the rank's GPU next to its allocator's",
}
"""Rules whose evidence only a GPU run has: each is shown, and not shown, on H200 recordings in
tests/unit/test_memory_recordings.py (gpu/scenarios/ made them)."""

GROWTH_RULE_CASES = {
    "memory-grows-every-step": ("keeps_outputs.py, and --hook", ["--plateau adam", "cache", "batches"]),
}
"""tests/engines/test_memory_growth_runs.py: the runs that show it, and those that come close."""

STALL_RULE_CASES = {"rank-stalled": ("skips_collective.py", ["skips_collective.py --long-step"])}
"""tests/engines/test_stalls.py: the run that shows it, and the one that comes close."""
