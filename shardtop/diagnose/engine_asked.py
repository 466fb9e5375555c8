"""The engine a launcher's configuration asked for, against the one the ranks train with.

``accelerate launch`` tells its ranks what its config file asked through the
environment (``ACCELERATE_USE_FSDP`` with ``FSDP_VERSION``,
``ACCELERATE_USE_DEEPSPEED`` with ``ACCELERATE_DEEPSPEED_ZERO_STAGE``), and the
Trainer's ``--fsdp`` and ``--deepspeed`` set the same; every rank's ``Hello``
records it (``asked_engine``).  accelerate falls back to DDP where it cannot
run what was asked: its FSDP runs only on accelerator devices, so TRL's
``fsdp2.yaml`` on CPU processes trains with DDP, every rank holding the whole
model.  Such a run is sharded less than its configuration says.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtop.diagnose.finding import Evidence, Explanation, Rule
from shardtop.read.run_model import RunModel
from shardtop.rundir.engines import (
    DDP,
    DEEPSPEED,
    FSDP1,
    FSDP2,
    FSDP_ENGINES,
    PLAIN,
    WHOLE_MODEL_ENGINES,
    ZERO1,
    ZERO2,
    ZERO3,
    family,
)
from shardtop.units import format_bytes

NAMES = {FSDP1: "FSDP", FSDP2: "FSDP2", ZERO1: "DeepSpeed ZeRO-1", ZERO2: "DeepSpeed ZeRO-2",
         ZERO3: "DeepSpeed ZeRO-3", DEEPSPEED: "DeepSpeed", DDP: "DDP", PLAIN: "no engine"}


@dataclass(frozen=True)
class EngineNotAsked(Evidence):
    asked: str
    """The engine the launcher's configuration asked for (``fsdp2``, ``zero3``...)."""
    engine: str
    """The engine the ranks hold the model with."""
    device: str
    world_size: int
    model_bytes: int
    """The model's full size: what each rank holds more than asked, at most."""


def find_engine_not_asked(m: RunModel) -> EngineNotAsked | None:
    asked = next((r.hello.asked_engine for r in m.ranks if r.hello is not None and r.hello.asked_engine), "")
    engine = m.engine
    if not asked or not engine or not m.engine_ranks or family(asked) == family(engine):
        return None
    device = next((r.device for r in m.ranks if r.device), "")
    return EngineNotAsked(asked, engine, device, m.world_size, m.full_bytes)


def explain_engine_not_asked(e: EngineNotAsked) -> Explanation:
    asked, engine = NAMES.get(e.asked, e.asked), NAMES.get(e.engine, e.engine)
    whole = f" ({format_bytes(e.model_bytes)})" if e.model_bytes and e.engine in WHOLE_MODEL_ENGINES else ""
    detail = (
        f"The launcher's configuration asked for {asked}, and the ranks hold the model with {engine}"
        f"{': each of the ' + str(e.world_size) + ' ranks holds the whole model' + whole if whole else ''}."
    )
    if e.device.startswith("cpu") and e.asked in FSDP_ENGINES:
        fix = ("accelerate runs FSDP only on accelerator devices and trains with DDP on CPU processes: run on "
               "GPUs to shard, or read this run's memory as DDP's.")
    else:
        fix = (f"Check which engine the script and its launcher set up (`accelerate env`, the Trainer's "
               f"arguments): the ranks did not apply the {asked} that was asked.")
    return Explanation(
        title=f"{asked} was asked for, the ranks run {engine}",
        detail=detail,
        fix=fix,
        severity="warning",
    )


ENGINE_NOT_ASKED = Rule("engine-not-as-asked", find_engine_not_asked, explain_engine_not_asked)
