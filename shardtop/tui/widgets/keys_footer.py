"""``KeysFooter``: Textual's footer of keys, built again only when the keys it shows change."""

from __future__ import annotations

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer


def keys_shown(screen: Screen[object]) -> tuple[tuple[Binding, bool, str], ...]:
    """The keys a footer shows on ``screen``: each binding shown, whether it is enabled, its tooltip."""
    return tuple(
        (binding, enabled, tooltip)
        for (_, binding, enabled, tooltip) in screen.active_bindings.values()
        if binding.show
    )


PALETTE_CELLS = 14
"""What the command palette's key takes at the right end of the footer (``^p palette`` and its border)."""


def footer_fit(widths: list[int], width: int) -> tuple[bool, bool]:
    """(compact, with the palette's key) for keys of ``widths`` cells (key, space, description) in ``width``
    cells: Textual's spacing (two cells more a key) where everything fits, else compact (one more), else
    compact without the palette's key (ctrl+p still opens it; the help says so)."""
    if sum(widths) + 2 * len(widths) + PALETTE_CELLS <= width:
        return False, True
    return True, sum(widths) + len(widths) + PALETTE_CELLS <= width


class KeysFooter(Footer):
    """The footer of keys.

    Textual's ``Footer`` builds its keys again (a widget each) whenever the
    screen's bindings may have changed: a run view that opens and moves the
    focus twice built its nine keys three times.  This one builds them again
    only when the keys it would show differ from those it shows, or when the
    terminal's width calls for a tighter footer (``footer_fit``): at 80
    columns every key of the run view stays on screen.
    """

    _shown: tuple[tuple[Binding, bool, str], ...] | None = None
    _fit: tuple[bool, bool] | None = None

    def _fitted(self, shown: tuple[tuple[Binding, bool, str], ...]) -> tuple[bool, bool]:
        app = self.app
        widths = [cell_len(app.get_key_display(b)) + 1 + cell_len(b.description) for b, _, _ in shown]
        return footer_fit(widths, self.size.width or app.size.width)

    async def on_resize(self) -> None:
        if self._shown is not None and self._fitted(self._shown) != self._fit:
            await self.recompose()

    def compose(self) -> ComposeResult:
        """Textual's keys, noting which: the screen's bindings may have moved on since the build was asked for."""
        shown = keys_shown(self.screen)
        self._fit = self._fitted(shown)
        self.compact, self.show_command_palette = self._fit
        built = False
        for widget in super().compose():
            built = True
            yield widget
        if built:
            self._shown = shown

    def bindings_changed(self, screen: Screen[object]) -> None:
        if screen is not self.screen or not self.is_attached:
            super().bindings_changed(screen)
            return
        shown = keys_shown(screen)
        if shown == self._shown:
            return
        if screen.app.app_focus:  # Textual builds the keys only then
            self._shown = shown
        super().bindings_changed(screen)
