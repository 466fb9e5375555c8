"""One event as one line of an event file, and a line back as an event.

``encode`` writes an event as one JSON object and its newline.  ``decode``
never raises: it returns the event, or the reason (a ``SkipReason``) the line
was skipped, so a reader can count what it skips: a torn last line, a line
of the wrong shape, a kind it does not know, a newer schema version.
"""

from __future__ import annotations

import msgspec

from shardtop.rundir.events import EVENT_TYPES, SCHEMA_VERSION, AnyEvent, Event

KNOWN_KINDS = frozenset(t.__struct_config__.tag for t in EVENT_TYPES)
"""The kinds this reader decodes; a line of any other kind is skipped as ``SkipReason.UNKNOWN``."""

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyEvent)
_header = msgspec.json.Decoder(dict)


def encode(event: Event) -> bytes:
    """One event as one JSON line (with its newline)."""
    return _encoder.encode(event) + b"\n"


class SkipReason:
    BAD = "bad"
    """Not JSON, or a known kind with fields of the wrong shape."""
    UNKNOWN = "unknown"
    """A kind this reader does not know."""
    NEWER = "newer"
    """Written by a newer schema version."""


def decode(line: bytes) -> AnyEvent | str:
    """An event, or the reason (a ``SkipReason``) the line was skipped."""
    try:
        event = _decoder.decode(line)
    except msgspec.DecodeError:
        pass
    else:
        return SkipReason.NEWER if event.v > SCHEMA_VERSION else event
    try:
        header = _header.decode(line)
    except msgspec.DecodeError:
        return SkipReason.BAD
    version = header.get("v", SCHEMA_VERSION)
    if isinstance(version, int) and version > SCHEMA_VERSION:
        return SkipReason.NEWER
    kind = header.get("kind")
    if not isinstance(kind, str) or kind not in KNOWN_KINDS:
        return SkipReason.UNKNOWN
    return SkipReason.BAD
