"""What the footer of keys shows, as text: what a user reads at the bottom of the screen."""

from __future__ import annotations

from shardtop.tui.widgets.keys_footer import KeysFooter


def footer_keys(app: object) -> str:
    footer = app.screen.query_one(KeysFooter)  # type: ignore[attr-defined]
    return "  ".join(key.render().plain.strip() for key in footer.children)
