"""A frozen record read from a JSON object one field at a time: a field of the wrong shape reads as missing.

``run.json`` is written by shardtop's launchers, by ranks of a user's script and
by older versions of shardtop, and read by every view.  One field that is not
what a reader expects (a world size written as text) costs that field alone:
it keeps the record's default, and the rest of the record still reads.  No
torch here, and nothing else of shardtop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import msgspec

Record = TypeVar("Record", bound=msgspec.Struct)


def read_fields(
    record: type[Record], raw: Mapping[str, Any], **readers: Callable[[Any], Any] | None
) -> Record:
    """``raw`` as a ``record``: each field converted on its own (strictly: ``"2"`` is no number), or left at
    its default where it is missing or of another shape.  ``readers`` read the fields they name their own
    way (None: not from ``raw``)."""
    found: dict[str, object] = {}
    for field in msgspec.structs.fields(record):
        reader = readers.get(field.name, _convert(field.type))
        if reader is None or field.encode_name not in raw:
            continue
        try:
            found[field.name] = reader(raw[field.encode_name])
        except msgspec.ValidationError:
            continue
    return record(**found)


def _convert(kind: Any) -> Callable[[Any], Any]:
    return lambda value: msgspec.convert(value, kind, strict=True)
