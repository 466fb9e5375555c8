"""``KeysFooter``: Textual's footer of keys, built again only when the keys it shows change."""

from __future__ import annotations

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


class KeysFooter(Footer):
    """The footer of keys.

    Textual's ``Footer`` builds its keys again (a widget each) whenever the
    screen's bindings may have changed: a run view that opens and moves the
    focus twice built its nine keys three times.  This one builds them again
    only when the keys it would show differ from those it shows.
    """

    _shown: tuple[tuple[Binding, bool, str], ...] | None = None

    def compose(self) -> ComposeResult:
        """Textual's keys, noting which: the screen's bindings may have moved on since the build was asked for."""
        shown = keys_shown(self.screen)
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
