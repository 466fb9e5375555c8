"""``PresetList``: the presets, one line each; Enter launches the highlighted one (unless read-only)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from shardtop.config import Preset


class PresetList(OptionList):
    """The presets a run can start from; the option ids are the preset names.

    In focus, one preset is always highlighted (the first, until the cursor moves), so the first ↓
    moves to the second preset and Enter opens the one the highlight is on.
    """

    DEFAULT_CSS = """
    PresetList {
        height: 1fr;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, read_only: bool = False, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = "Presets" + (" (read-only: no launch)" if read_only else " · Enter launches")
        self._names: tuple[str, ...] = ()

    def show(self, presets: tuple[Preset, ...]) -> None:
        names = tuple(p.name for p in presets)
        if names == self._names:
            return
        self._names = names
        self.clear_options()
        self.add_options(
            Option(
                Text.assemble((p.name, "bold"), "  ", (p.description, "italic"), no_wrap=True, overflow="ellipsis"),
                id=p.name,
            )
            for p in presets
        )
        if self.has_focus:
            self._highlight_first()

    def on_focus(self) -> None:
        self._highlight_first()

    def _highlight_first(self) -> None:
        if self.highlighted is None and self.option_count:
            self.highlighted = 0

    @property
    def selected(self) -> str | None:
        if self.highlighted is None:
            return None
        return self.get_option_at_index(self.highlighted).id
