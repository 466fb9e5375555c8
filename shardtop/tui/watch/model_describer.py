"""A preset's model description, made in a helper process: the TUI never imports torch.

The launch prompt replans on every key, which is arithmetic (``make_plan``)
once the model's description is in hand.  The description itself needs the
model built on the meta device, so ``describe`` starts ``python -m
shardtop.trace`` with the resolved config on stdin and reads the description
back as msgspec JSON.  It runs in a worker thread (a blocking call) and
kills the helper if the worker is cancelled (the user typed other sizes).
Answers are kept per description key (preset program, model sizes, batch):
the same sizes never start a second helper, a failure included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from shardtop.plan.description import ModelDescription
from shardtop.plan.presets import DescriptionKey

POLL_S = 0.05
"""How often the worker looks whether it was cancelled while the helper runs."""
TIMEOUT_S = 120.0
KEPT = 16
"""Descriptions kept (the oldest goes first): a description of 18 000 layers is about 1 MB."""


@dataclass(frozen=True)
class DescribeFailed:
    """Why there is no description, in one line."""

    reason: str


Described = ModelDescription | DescribeFailed

_answers: dict[DescriptionKey, Described] = {}
"""Descriptions (and failures) by key, for this process: the prompt reopens and retypes often."""


def known(key: DescriptionKey) -> Described | None:
    return _answers.get(key)


def remember(key: DescriptionKey, answer: Described) -> None:
    _answers.pop(key, None)
    _answers[key] = answer
    while len(_answers) > KEPT:
        del _answers[next(iter(_answers))]


def describe(config: Mapping[str, Any], cancelled: Callable[[], bool]) -> Described | None:
    """The description of ``config``'s model from a helper process; None if cancelled meanwhile."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shardtop.trace"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
    except OSError as e:
        return DescribeFailed(f"could not start the planning helper ({e.strerror or e})")
    given: bytes | None = json.dumps(dict(config), default=str).encode()
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:  # communicate, not wait: a description of 18 000 layers is larger than a pipe holds
            out, err = proc.communicate(given, timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            given = None  # sent with the first call; a retry loses nothing
            if cancelled() or time.monotonic() > deadline:
                proc.kill()
                proc.communicate()
                return None if cancelled() else DescribeFailed(f"planning took over {TIMEOUT_S:.0f} s; stopped")
    if proc.returncode != 0:
        lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
        return DescribeFailed(lines[-1].strip() if lines else f"the planning helper exited with {proc.returncode}")
    try:
        return msgspec.json.decode(out, type=ModelDescription)
    except msgspec.DecodeError as e:
        return DescribeFailed(f"the planning helper's answer could not be read ({e})")
