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
``plan_only.PATCHES`` instead, and nothing is recorded as a run.  Under
``shardtop rehearse`` (``rehearsal_env.REHEARSE_ENV``) it first puts the rehearsed
rank's environment back in place (a launcher sets its own for its children), and
adds ``rehearsal.PATCHES``: the fake process group, one process per launcher,
Lightning on one device.
"""

from __future__ import annotations

import sys

from shardtop.inject.import_hook import PostImportHook

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType, TracebackType

    from shardtop.inject.import_hook import Patch

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
    from shardtop.inject.mem_cap import patches as cap_patches
    from shardtop.inject.rehearsal_env import reassert

    patches = both(cap_patches(), PATCHES)
    if reassert() is not None:
        from shardtop.inject.rehearsal import PATCHES as REHEARSAL_PATCHES

        patches = both(REHEARSAL_PATCHES, patches)
    sys.meta_path.insert(0, PostImportHook(patches))
    _install_excepthook()


def both(first: dict[str, Patch], then: dict[str, Patch]) -> dict[str, Patch]:
    """One patch per module name that runs ``first``'s, then ``then``'s."""

    def chain(a: Patch, b: Patch) -> Patch:
        def patch(module: ModuleType) -> None:
            a(module)
            b(module)

        return patch

    merged = dict(then)
    for name, patch in first.items():
        merged[name] = chain(patch, then[name]) if name in then else patch
    return merged


def _install_excepthook() -> None:
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if "shardtop.inject.this_rank" in sys.modules:  # only a process that became a rank has anything to record
            from shardtop.inject.this_rank import record_uncaught

            record_uncaught(error)
        previous(kind, error, tb)

    sys.excepthook = excepthook
