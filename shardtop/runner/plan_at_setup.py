"""Rank 0 of a preset run plans the strategy it is about to run, so the run can be checked against it.

The plan is made from the run's resolved config, exactly as ``shardtop plan``
makes it (same devices, same GPU or ``gpu_mem_limit``), before the program
starts and before the memory cap applies: it builds the model on the meta
device, which allocates no tensor, and costs milliseconds for the small
presets and about 1-3 s for story 2's 18 000 layers.  Rank 0 writes its
figures into its event file, through its probe, as one ``Planned`` event; the report and the run view
then show predicted against measured per rank.  A plan that fails costs the
run nothing but one line in rank 0's log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardtop.plan.cards import Gpu
    from shardtop.rundir.events import Planned
    from shardtop.rundir.run_config import RunConfig


def plan_event(config: RunConfig, accelerator: str, card: Gpu | None = None) -> Planned | None:
    """The plan of ``config`` on its ``devices`` (one process may drive several: manual placement), as an event.

    ``card``: the GPU to judge against; by default this machine's first GPU (NVML), capped by ``gpu_mem_limit``.
    None when the plan could not be made (said in one line on the rank's output).
    """
    try:
        from shardtop.plan.cards import judged_against, local_gpu
        from shardtop.plan.record import planned_event
        from shardtop.trace.presets import plan_config

        if card is None and accelerator == "cuda":
            card = local_gpu()
        gpu = judged_against(card, config.gpu_mem_limit)
        plan = plan_config(config.settings, devices=config.devices, accelerator=accelerator, gpu=gpu)
        return planned_event(plan, made_by="preset")
    except Exception as e:  # noqa: BLE001 - the run goes on without its plan
        print(f"shardtop: no plan for this run ({type(e).__name__}: {e})", flush=True)
        return None
