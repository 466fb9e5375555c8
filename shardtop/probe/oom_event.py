"""The OOM event a rank writes: attributed to a module where that works, worded whatever happens; and the
objects its error passed through, whose buffers the split at the OOM counts."""

from __future__ import annotations

from typing import Any

import msgspec

from shardtop.probe.faults import Faults, describe
from shardtop.probe.oom import attribute
from shardtop.probe.oom_errors import first_line, oom_path
from shardtop.rundir.events import Oom, StackTensor


def oom_event(
    exc: BaseException,
    faults: Faults,
    *,
    names: dict[int, str],
    phase: str,
    step: int,
    device: str,
    tracker: Any,
    limit: int | None,
    starved: bool,
) -> Oom:
    """The OOM of ``exc``: attributed (``oom.attribute``), else with what is known without that (phase,
    step, message); a rank starved at its data cap says so, a bare ``MemoryError`` at least what it is.
    A part that fails is the ``oom`` part's fault (``faults``), never the training's."""
    event: Oom | None = None
    with faults.guard("oom"):
        event = attribute(exc, names=names, phase=phase, step=step, device=device, tracker=tracker, limit=limit)
    if event is None:
        event = Oom(phase=phase, step=step, device=device, limit=limit, message=_first_line_of(exc))
    with faults.guard("oom"):
        event = _worded(event, exc, starved)
    return event


def _first_line_of(exc: BaseException) -> str:
    try:
        return first_line(str(exc))
    except Exception:  # noqa: BLE001
        return type(exc).__name__


def _worded(event: Oom, exc: BaseException, starved: bool) -> Oom:
    """The OOM's message: a starved rank's says so; a bare MemoryError's says at least what it is."""
    if starved:
        return msgspec.structs.replace(event, message=_starved_message(exc))
    if not event.message:
        return msgspec.structs.replace(event, message=describe((oom_path(exc) or [exc])[-1]))
    return event


def _starved_message(exc: BaseException) -> str:
    """An error that is an OOM only by where it struck: say both."""
    return f"{type(exc).__name__}: {_first_line_of(exc)} (raised with the data segment at its cap, RLIMIT_DATA)"


def tensors_on_stack(error: BaseException | None) -> list[Any]:
    """The tensors the frames the error passed through hold, alone or in a tuple, list or dict: what
    the graphs alive at the error hang from (a loss being computed, outputs a loop kept)."""
    import torch

    found: dict[int, Any] = {}
    for frame in _frames(error):
        for value in frame.f_locals.values():
            for item in _items(value):
                if isinstance(item, torch.Tensor) and item.grad_fn is not None:
                    found.setdefault(id(item), item)
    return list(found.values())


MAX_STACK_TENSORS = 4
STACK_TENSOR_MIN = 1 << 20
"""Tensors under 1 MiB on the failing stack say nothing about where the memory went."""


def stack_tensors(error: BaseException | None) -> list[StackTensor]:
    """The largest tensors the frames the error passed through held, by the local that held them."""
    import torch

    found: dict[int, StackTensor] = {}
    for frame, depth in _frames_with_depth(error):
        code = frame.f_code
        where = f"{code.co_name} ({code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})"
        for name, value in frame.f_locals.items():
            many = isinstance(value, (tuple, list))
            for index, item in enumerate(_items(value)):
                if not isinstance(item, torch.Tensor) or item.is_meta or id(item) in found:
                    continue
                nbytes = item.numel() * item.element_size()
                if nbytes >= STACK_TENSOR_MIN:
                    found[id(item)] = StackTensor(name=f"{name}[{index}]" if many else name, shape=list(item.shape),
                                                  dtype=str(item.dtype).removeprefix("torch."), nbytes=nbytes,
                                                  where=where, depth=depth)
    return sorted(found.values(), key=lambda t: -t.nbytes)[:MAX_STACK_TENSORS]


def kept_holder(error: BaseException | None, began: int | None) -> str:
    """The local variable on the failing stack that holds the most bytes of outputs an earlier forward made
    (sequence number before ``began``), in words; "" where none does."""
    if began is None:
        return ""
    import torch

    from shardtop.units import format_bytes

    best = ("", 0, 0)
    seen: set[int] = set()
    for frame in _frames(error):
        for name, value in frame.f_locals.items():
            count = nbytes = 0
            for item in _items(value):
                node = getattr(item, "grad_fn", None) if isinstance(item, torch.Tensor) else None
                if node is not None and node._sequence_nr() < began and id(item) not in seen:
                    seen.add(id(item))
                    count += 1
                    nbytes += item.untyped_storage().nbytes()
            if nbytes > best[2]:
                code = frame.f_code
                where = f"{code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
                best = (f"`{name}` in {code.co_name} ({where})", count, nbytes)
    where, count, nbytes = best
    return f"{where}, {count} tensor{'s' if count != 1 else ''}, {format_bytes(nbytes)}" if where else ""


def _items(value: Any) -> Any:
    """A value, or what a tuple, list or dict holds."""
    if isinstance(value, dict):
        return value.values()
    return value if isinstance(value, (tuple, list)) else (value,)


def _frames(error: BaseException | None) -> list[Any]:
    """The frames of ``error``'s traceback and of the errors it was raised from or during, once each."""
    return [frame for frame, _ in _frames_with_depth(error)]


def _frames_with_depth(error: BaseException | None) -> list[tuple[Any, int]]:
    """The frames of ``_frames``, each with how far it is from the frame its error was raised in (0: that
    frame, 1: its caller)."""
    frames: list[tuple[Any, int]] = []
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        own: list[Any] = []
        tb = error.__traceback__
        while tb is not None:
            own.append(tb.tb_frame)
            tb = tb.tb_next
        frames += [(frame, len(own) - 1 - index) for index, frame in enumerate(own)]
        error = error.__cause__ or error.__context__
    return frames


def objects_on_stack(error: BaseException | None) -> list[Any]:
    """The ``self`` of every frame the error passed through: an engine or optimizer still being built
    (a set-up OOM in ``_configure_zero_optimizer``) holds buffers no finished object points to yet."""
    found: list[Any] = []
    for frame in _frames(error):
        this = frame.f_locals.get("self")
        if this is not None and all(this is not known for known in found):
            found.append(this)
    return found
