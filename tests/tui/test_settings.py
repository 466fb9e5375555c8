"""Settings read from the environment: the refresh, and whether anything animates."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardtop.tui.app import ShardtopApp, refresh_setting


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, 1.0), ("0.25", 0.25), ("5", 5.0), ("0", 0.05), ("3600", 60.0), ("fast", 1.0), ("", 1.0)],
)
def test_the_refresh_is_read_within_its_bounds(value: str | None, seconds: float) -> None:
    environ = {} if value is None else {"SHARDTOP_REFRESH": value}
    assert refresh_setting(environ) == seconds


def test_nothing_animates_unless_textual_animations_asks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over SSH a sliding tab underline costs kilobytes; a user who wants it sets TEXTUAL_ANIMATIONS."""
    monkeypatch.delenv("TEXTUAL_ANIMATIONS", raising=False)
    assert ShardtopApp(tmp_path).animation_level == "none"
    monkeypatch.setenv("TEXTUAL_ANIMATIONS", "full")
    assert ShardtopApp(tmp_path).animation_level != "none"
