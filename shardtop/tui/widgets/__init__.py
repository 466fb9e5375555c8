"""Widgets, one per module, named for what the user sees."""
