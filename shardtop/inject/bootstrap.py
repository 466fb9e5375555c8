"""What runs in every Python process of a ``shardtop run`` command at start-up.

It must cost a non-rank process (a launcher, a dataloader worker, any helper
script) no more than a few milliseconds and change nothing it does: it imports
no torch and writes nothing.  It installs

- an import hook that patches the engines' entry points the moment their
  modules load (``engines.PATCHES``); whether this process is a rank is only
  decided when one of them, or the model, is first called (``this_rank.py``);
- an excepthook that, in a rank, records an OOM (which module, which phase)
  and the rank's exit before Python prints the traceback.

Under ``shardtop plan -- CMD`` (``PLAN_ONLY_ENV``) the import hook installs
``plan_only.PATCHES`` instead, and nothing is recorded as a run.
"""

from __future__ import annotations

import sys

from shardtop.inject.import_hook import PostImportHook

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType

_booted = False


def boot() -> None:
    global _booted
    if _booted:
        return
    _booted = True
    import os

    from shardtop.inject import PLAN_ONLY_ENV

    if os.environ.get(PLAN_ONLY_ENV):
        from shardtop.inject.plan_only import PATCHES as PLAN_PATCHES

        sys.meta_path.insert(0, PostImportHook(PLAN_PATCHES))
        return
    from shardtop.inject.engines import PATCHES

    sys.meta_path.insert(0, PostImportHook(PATCHES))
    _install_excepthook()


def _install_excepthook() -> None:
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if "shardtop.inject.this_rank" in sys.modules:  # only a process that became a rank has anything to record
            from shardtop.inject.this_rank import record_uncaught

            record_uncaught(error)
        previous(kind, error, tb)

    sys.excepthook = excepthook
