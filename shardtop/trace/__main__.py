"""``python -m shardtop.trace``: a preset's model description, as JSON, for a process without torch.

The launch prompt replans on every key, but describing the model needs torch,
which the TUI never imports.  So it starts this with the resolved preset
config (JSON) on stdin and reads one ``ModelDescription`` (msgspec JSON) from
stdout; every plan after that is arithmetic in the TUI itself.  A config the
plan cannot read exits 2 with the reason on stderr, in one line; a model that
cannot be built on the meta device exits 1, the same way.
"""

from __future__ import annotations

import json
import sys

import msgspec

from shardtop.config import ConfigError
from shardtop.plan.command import leave_now


def main() -> int:
    try:
        config = json.loads(sys.stdin.read())
    except ValueError as e:
        config = e
    if not isinstance(config, dict):
        print(f"expected a resolved preset config as a JSON object on stdin ({config})", file=sys.stderr)
        return 2
    from shardtop.trace.presets import describe_preset

    try:
        desc = describe_preset(config)
    except (ConfigError, KeyError) as e:
        print(f"cannot plan this preset: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - said in one line; the prompt shows it
        print(f"could not build the model on the meta device ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(msgspec.json.encode(desc) + b"\n")
    return 0


if __name__ == "__main__":
    leave_now(main())
