"""Which strategies a plan shows next to the one asked, and what each change costs.

The alternatives that matter for memory: the asked strategy with the model
built where the engine can split it as it is made, at the other precision,
and every engine's usual settings (DDP; ZeRO-1/2/3, with optimizer and
parameter offload; FSDP FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, CPU offload;
FSDP2) with the same optimizer, precision and loop.  Only those that apply to
the device the run uses: on CPU processes nothing is offloaded, since the
memory an offload would free is the same memory it moves to.  Torch-free.
"""

from __future__ import annotations

from shardtop.plan.strategies import LIGHTNING_ZERO, Strategy, ZeroSettings
from shardtop.rundir.engines import MANUAL, ZERO_ENGINES


def offloads(s: Strategy) -> bool:
    """Moves parameters or optimizer state to host memory (or NVMe)."""
    return s.offload_params or s.offload_optimizer


def alternatives(asked: Strategy, devices: int, accelerator: str = "cuda", *, rebuildable: bool = True
                 ) -> list[Strategy]:
    """The asked strategy first, then the alternatives that apply on ``accelerator``, each label once.

    ``rebuildable`` False: the model cannot be built where the engine partitions it (a 4-bit model, which
    transformers loads whole): every ZeRO-3 row has it built whole first."""
    precision = asked.precision
    zero = asked.zero if asked.engine in ZERO_ENGINES else (
        LIGHTNING_ZERO if asked.driver == "lightning" else ZeroSettings())
    common = Strategy(engine="ddp", precision=precision, optimizer=asked.optimizer, driver=asked.driver,
                      zero=zero, node_size=asked.node_size)
    out = [asked]
    if asked.built_whole and rebuildable:
        out.append(asked.with_(built_whole=False, build_note=""))
    if asked.engine != MANUAL:
        other = "bf16-mixed" if precision == "fp32" else "fp32"
        rebuilt: dict[str, object] = {"built_whole": False, "build_note": ""} if rebuildable else {}
        out.append(asked.with_(precision=other, half_in_units_only=False, **rebuilt))
    fsdp: dict[str, object] = {"units": (), "root_wrapped": True}
    zero3 = common.with_(engine="zero3", built_whole=not rebuildable)
    out += [
        common.with_(engine="ddp"),
        common.with_(engine="zero1"),
        common.with_(engine="zero2"),
        common.with_(engine="zero2", offload_optimizer=True),
        zero3,
        zero3.with_(offload_optimizer=True),
        zero3.with_(offload_optimizer=True, offload_params=True),
        common.with_(engine="fsdp1", sharding="FULL_SHARD", **fsdp),
        common.with_(engine="fsdp1", sharding="SHARD_GRAD_OP", **fsdp),
        common.with_(engine="fsdp1", sharding="FULL_SHARD", offload_params=True, **fsdp),
        common.with_(engine="fsdp2", sharding="FULL_SHARD", **fsdp),
    ]
    if devices > asked.node_size:
        out.append(common.with_(engine="fsdp1", sharding="HYBRID_SHARD", **fsdp))
    if accelerator != "cuda":
        out = [asked, *(s for s in out[1:] if not offloads(s))]
    seen: set[str] = set()
    unique = []
    for s in out:
        if s.label not in seen:
            seen.add(s.label)
            unique.append(s)
    return unique


def change_cost(asked: Strategy, other: Strategy) -> int:
    """How much a user gives up to switch from ``asked`` to ``other``: 0 (nothing) to 5.

    Building the model where the engine partitions it costs nothing at run
    time; a precision change costs accuracy checks; another engine costs a
    code change; offloading the optimizer slows each step; offloading the
    parameters slows it most.
    """
    if other.offload_params and not asked.offload_params:
        return 5
    if other.offload_optimizer and not asked.offload_optimizer:
        return 4
    if other.engine != asked.engine or other.sharding != asked.sharding:
        return 3
    if other.precision != asked.precision:
        return 2
    if asked.built_whole and not other.built_whole:
        return 0
    return 1
