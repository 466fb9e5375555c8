"""One training rank: plan it (rank 0), apply the memory cap, run the preset's program, leave cleanly.

A rank leaves with ``os._exit`` once its output is flushed: gloo runs abort at
interpreter exit now and then ("terminate called without an active
exception"), which would turn a finished run into a failed one.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from pathlib import Path

from shardtop.rundir.run_directory import RunDirectory
from shardtop.runner.context import RankContext


def _raise_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run_rank(run_dir: Path, rank: int) -> int:
    from shardtop.runner.programs import load_program

    run = RunDirectory(run_dir)
    config = run.read_meta().config
    ctx = RankContext(
        run_dir=run.path,
        rank=rank,
        world_size=config.world_size,
        accelerator=config.accelerator or "cpu",
        config=config.settings,
        gpu_mem_limit=config.gpu_mem_limit,
    )
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    if config.rehearsal is not None:
        # before the program imports torch: the fake process group, Lightning on one device
        from shardtop.inject.rehearsal import install

        install()
    code = 0
    error: BaseException | None = None
    try:
        from shardtop.probe.api import prepare
        from shardtop.runner.limits import apply_memory_limit

        program = load_program(config.program)  # its imports are not the run's memory
        # The probe's file, thread and OOM reserve exist before the cap: an OOM anywhere is recorded.
        probe = prepare(ctx.run_dir, rank=rank, world_size=ctx.world_size, local_rank=ctx.local_rank,
                        device=ctx.device, program=config.preset, engine=config.engine or "")
        if rank == config.first_rank:
            from shardtop.runner.plan_at_setup import plan_event

            planned = plan_event(config, ctx.accelerator)  # before the cap: the plan is not the run's memory
            if planned is not None:
                probe.writer.write(planned)
        probe.set_memory_limit(ctx.gpu_mem_limit)  # an OOM while the cap is put in place is under it already
        probe.set_memory_limit(apply_memory_limit(ctx))
        program(ctx)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        error = e
    except BaseException as e:
        code, error = 1, e  # first: printing can fail too (a rank out of memory cannot always print)
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001 - the failure is recorded below all the same
            pass
    finally:
        from shardtop.probe.api import finish

        finish(code, error)
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
