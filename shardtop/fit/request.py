"""What ``shardtop fit`` was asked: the job's size, its GPUs, the time it may take; parsed once, no I/O.

``devices=N`` is the size of the job (one number: fit searches one job size); ``gpu=SIZE|CARD`` its GPUs,
or ``gpu_mem_limit=SIZE`` in their place (it acts as the card, as in ``shardtop plan``); ``budget=10m``
the wall time fit may spend rehearsing.  What a rehearsed rank may hold follows from the GPU
(``Allowance``): on a GPU, PyTorch's share of the card; on CPU, where a rank stands for a GPU, the size
itself caps the rank's allocator (``runner/cpu_cap.py``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from shardtop.config import ConfigError, parse_size
from shardtop.plan.cards import NON_PYTORCH_BYTES, Gpu, UnknownGpu, limited, parse_gpu

DEFAULT_BUDGET_S = 600.0
"""Ten minutes: a few set-ups of a model that sets up in seconds, or one of a large model."""
MAX_BUDGET_S = 7 * 24 * 3600.0
_BUDGET = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*$", re.IGNORECASE)
_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
OWN_KEYS = ("devices", "gpu", "budget")


@dataclass(frozen=True)
class FitRequest:
    """``shardtop fit``'s settings once read."""

    devices: int
    gpu: Gpu | None
    """The job's GPU as asked (``gpu=`` or ``gpu_mem_limit=``); None: this machine's own GPU, if it has one."""
    budget_s: float
    settings: tuple[str, ...] = ()
    """A preset and its overrides as typed, without fit's own keys (empty for a command)."""


@dataclass(frozen=True)
class Allowance:
    """What a rehearsed rank may hold, and what the plan judges against."""

    cap: int | None
    """Bytes the rehearsed rank is capped at (``gpu_mem_limit``); None where the device itself is the limit."""
    limit: int
    """What a rank of the job may hold: the cap, or the local card's share where no cap is needed."""
    judged: Gpu
    """The GPU the plan judges against (its ``usable`` keeps the plan's allowance for fragmentation)."""


def parse_budget(text: str) -> float:
    """``10m``, ``90s``, ``1.5h`` or plain seconds, as seconds."""
    m = _BUDGET.match(text)
    seconds = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()] if m else 0.0
    if not 0 < seconds <= MAX_BUDGET_S:
        raise ConfigError(f"budget={text}: expected a time such as budget=10m, budget=90s or budget=1h.")
    return seconds


def _devices(text: str) -> int:
    value = text.strip()
    if not value.isdigit() or not 1 <= int(value) <= 1 << 20:
        raise ConfigError(
            f"devices={text}: expected the number of GPUs of the job, e.g. devices=8 (fit searches one job size; "
            "`shardtop rehearse PRESET devices=2,4,8` compares sizes)."
        )
    return int(value)


def _gpu(text: str) -> Gpu:
    try:
        return parse_gpu(text)
    except UnknownGpu as e:
        raise ConfigError(str(e)) from None


def _limit(text: str) -> Gpu:
    try:
        size = parse_size(text)
    except ValueError:
        size = 0
    if size <= 0:
        raise ConfigError(f"gpu_mem_limit={text}: expected a size such as 15GiB or 512MiB.")
    return limited(size)


def read_fit_request(settings: Sequence[str], *, command: bool) -> FitRequest:
    """fit's own keys taken out of ``settings``; for a command nothing else may stand before ``--``."""
    devices: int | None = None
    gpu: Gpu | None = None
    capped: Gpu | None = None
    budget = DEFAULT_BUDGET_S
    rest: list[str] = []
    for word in settings:
        key, eq, value = word.partition("=")
        key = key.strip()
        if eq and key == "devices":
            devices = _devices(value)
        elif eq and key == "gpu":
            gpu = _gpu(value)
        elif eq and key == "budget":
            budget = parse_budget(value)
        elif eq and key == "gpu_mem_limit":
            capped = _limit(value)
            if not command:
                rest.append(word)
        elif command:
            raise ConfigError(
                f"{word!r}: fitting your own command takes devices=N, gpu=SIZE|CARD and budget= before --; "
                "its own settings go after -- as it takes them, e.g. "
                "shardtop fit devices=8 gpu=H100 -- torchrun --nproc_per_node 8 train.py --batch-size 4"
            )
        else:
            rest.append(word)
    if devices is None:
        example = ("shardtop fit devices=8 gpu=H100 -- torchrun --nproc_per_node 8 train.py" if command
                   else "shardtop fit zero3-linear-fixed devices=6 gpu=16GiB")
        raise ConfigError(f"how many GPUs has the job? e.g. {example}")
    if gpu is not None and capped is not None:
        gpu = capped if capped.usable < gpu.usable else gpu
    return FitRequest(devices=devices, gpu=gpu if gpu is not None else capped, budget_s=budget, settings=tuple(rest))


def allowance(gpu: Gpu, accelerator: str, local_total: int | None) -> Allowance:
    """What a rank of the job may hold, rehearsed on ``accelerator`` (``local_total``: this machine's first
    GPU's memory, where it has one).

    On CPU the GPU's size caps the rank; a card by name keeps aside what is not PyTorch's on it.  On a
    GPU, PyTorch's share of the card asked for; no cap where that is all this GPU has anyway.
    """
    share = gpu.total if gpu.source == "gpu_mem_limit" else max(1, gpu.total - NON_PYTORCH_BYTES)
    if accelerator != "cuda":
        cap = gpu.total if gpu.source == "gpu_mem_limit" or _is_size(gpu) else share
        return Allowance(cap=cap, limit=cap, judged=limited(cap))
    if local_total is not None and share >= local_total - NON_PYTORCH_BYTES:
        return Allowance(cap=None, limit=local_total - NON_PYTORCH_BYTES, judged=gpu)
    return Allowance(cap=share, limit=share, judged=gpu)


def _is_size(gpu: Gpu) -> bool:
    """``gpu=16GiB`` rather than a card by name: a size is what the rank may hold."""
    try:
        parse_size(gpu.source.partition("=")[2])
    except ValueError:
        return False
    return True
