"""Run a function on a module right after it loads, whoever imports it and however.

A finder first on ``sys.meta_path`` answers only for the few module names it
watches (a set lookup for every other import): it asks the other finders for
the real spec and wraps its loader, so that the module runs as usual and is
then handed to the patch.  The module keeps its real loader (``__loader__``,
``__spec__.loader``), so resource loading and reloads behave as before.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing and importlib.abc cost a launcher milliseconds: the protocols are duck-typed
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

    Patch = Callable[[ModuleType], None]


class PostImportHook:
    """Calls ``patches[name](module)`` once ``name`` has loaded."""

    def __init__(self, patches: Mapping[str, Patch]) -> None:
        self.patches = dict(patches)
        self._finding: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        patch = self.patches.get(fullname)
        if patch is None or fullname in self._finding:
            return None
        self._finding.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._finding.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, patch)  # type: ignore[assignment]
        return spec


class _PatchingLoader:
    def __init__(self, loader: Any, patch: Patch) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            self.patch(module)
        except Exception as e:  # noqa: BLE001 - never break the user's import
            from shardtop.inject.this_rank import give_up

            give_up(f"patching {module.__name__}", e)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
