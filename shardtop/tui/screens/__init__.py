"""Screens: home, run view, and the dialogs."""
