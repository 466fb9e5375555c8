"""Presets and ``key=value`` overrides, resolved into one validated run config.

A preset is a YAML file in the top-level ``presets/`` directory (shipped inside
the package as ``shardtop/presets/``).  Its keys are the settings a user may
override; each override must name an existing key (dotted for nested ones,
``model.n_layers=64``) and carry a value of that key's type.  Anything else is
a ``ConfigError`` whose message says what was wrong and what to type.  No torch
here, and ``decimal``, ``difflib`` and ``importlib.resources`` are imported where
used: every command imports this module for ``ConfigError``, before its first frame.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from importlib.abc import Traversable

FIXED_KEYS = ("description", "program", "engine", "single_process", "on_cpu")
"""Keys that describe a preset rather than tune it: not overridable.

``on_cpu`` holds smaller defaults used when the run lands on CPU processes,
for keys the user did not set."""

ACCELERATORS = ("auto", "cpu", "cuda")
OFFLOAD_DEVICES = ("none", "cpu")
"""Where a ZeRO preset's ``zero.offload_optimizer`` / ``zero.offload_param`` put what they offload: DeepSpeed's
``offload_optimizer.device`` / ``offload_param.device`` (its third, ``nvme``, needs a path no preset sets)."""
CHOICE_KEYS: dict[str, tuple[str, ...]] = {
    "accelerator": ACCELERATORS,
    "zero.offload_optimizer": OFFLOAD_DEVICES,
    "zero.offload_param": OFFLOAD_DEVICES,
}
"""Keys whose value is one of a few words, and those words."""
CPU_DEFAULT_DEVICES = 2
"""Processes a preset runs on a machine without GPUs when ``devices=auto``."""
SIZE_KEYS = ("gpu_mem_limit",)
"""Keys whose value is a byte size (``15GiB``, ``512MB``, ``1073741824``) or null."""

MAX_INT = 2**63 - 1
"""The largest integer setting: what the engines (and C) can hold."""
MAX_SIZE = 2**50
"""The largest byte size (1 PiB): more than any GPU or machine has."""
SHOWN_CHARS = 80
"""A value quoted back in a message is cut to this many characters."""
class ConfigError(Exception):
    """Bad preset name, key or value; the message tells the user what to type."""


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kib": 2**10, "kb": 10**3,
    "m": 2**20, "mib": 2**20, "mb": 10**6,
    "g": 2**30, "gib": 2**30, "gb": 10**9,
    "t": 2**40, "tib": 2**40, "tb": 10**12,
    "p": 2**50, "pib": 2**50, "pb": 10**15,
}


def parse_size(text: str | int) -> int:
    """Bytes in ``15GiB``, ``15G`` (binary), ``15GB`` (decimal) or a plain number.

    Exact for any number of digits (no float rounding, no overflow): the caller
    bounds the result.
    """
    if isinstance(text, bool):
        raise ValueError(text)
    if isinstance(text, int):
        if text < 0:
            raise ValueError(text)
        return text
    m = _SIZE.match(str(text))
    if not m or (m.group(2) or "").lower() not in _UNITS:
        raise ValueError(text)
    from decimal import Decimal

    return int(Decimal(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    defaults: Mapping[str, Any]


_PRESET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def presets_dir() -> Traversable:
    """The preset files: inside the installed package, or the checkout's top-level ``presets/``.

    A wheel ships them as ``shardtop/presets/``; a source checkout (an editable
    install, or ``PYTHONPATH`` pointing at it) keeps them next to the package.
    Both are found from ``__file__``, so the working directory does not matter.
    """
    from importlib.resources import files

    packaged = files("shardtop").joinpath("presets")
    checkout = Path(__file__).resolve().parent.parent / "presets"
    for place in (packaged, checkout):  # a directory left empty by an older install holds no preset
        if place.is_dir() and any(p.name.endswith(".yaml") for p in place.iterdir()):
            return place
    raise ConfigError(
        f"shardtop's presets are missing (looked in {packaged} and {checkout}); reinstall shardtop."
    )


def preset_names() -> list[str]:
    return sorted(p.name[: -len(".yaml")] for p in presets_dir().iterdir() if p.name.endswith(".yaml"))


def load_preset(name: str) -> Preset:
    names = preset_names()
    if name not in names:
        raise ConfigError(_unknown_preset(name, names))
    import yaml

    data = yaml.safe_load(presets_dir().joinpath(f"{name}.yaml").read_text()) or {}
    return Preset(name=name, description=str(data.get("description", "")), defaults=data)


def _unknown_preset(name: str, names: list[str]) -> str:
    """What to say about a preset name that is not one: a path, a typo, or nothing like it."""
    listing = f"Presets: {', '.join(names)}.\n`shardtop presets` describes each."
    if not _PRESET_NAME.match(name) or name.endswith((".yaml", ".yml")):
        stem = re.sub(r"\.ya?ml$", "", name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1])
        hint = f" To run that preset, type its name: {stem}." if stem in names else ""
        return (
            f"{_shown(name)} is not a preset name: presets are chosen by name, not by path or file.{hint}\n"
            + listing
        )
    from difflib import get_close_matches

    close = get_close_matches(name, names, n=3, cutoff=0.4)
    hint = f"Did you mean: {', '.join(close)}?\n" if close else ""
    return f"unknown preset {_shown(name)}.\n{hint}{listing}"


def _shown(text: str) -> str:
    """``text`` quoted for a message, cut so a 5000-character value does not flood the terminal."""
    if len(text) <= SHOWN_CHARS:
        return repr(text)
    return f"{text[: SHOWN_CHARS - 1]!r}… ({len(text)} characters)"


def list_presets() -> list[Preset]:
    return [load_preset(n) for n in preset_names()]


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, object]:
    """``{"model": {"n_layers": 4}}`` as ``{"model.n_layers": 4}``: the dotted keys an override names."""
    out: dict[str, object] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def set_dotted(data: dict[str, object], dotted: str, value: object) -> None:
    """``data`` with ``model.n_layers``'s value set in ``data['model']['n_layers']`` (``flatten``'s inverse)."""
    *parents, last = dotted.split(".")
    node = data
    for p in parents:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{_shown(dotted)}: {p} holds a value, not settings under it.")
        node = child
    node[last] = value


def _parse_value(text: str) -> Any:
    """The override's value as YAML reads it; text YAML cannot read stays text.

    Any failure of the reader counts as unreadable: besides ``YAMLError``, a
    5000-digit integer raises ``ValueError`` and deep nesting ``RecursionError``.
    """
    import yaml

    if not text.strip():
        return ""
    try:
        return yaml.safe_load(text)
    except Exception:
        return text


def _type_name(value: Any) -> str:
    names = {bool: "true/false", int: "an integer", float: "a number", str: "text"}
    return names.get(type(value), type(value).__name__)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(key: str, default: Any, value: Any, raw: str) -> Any:
    """The override's value, converted to the key's type, or a ConfigError."""
    said = f"{key}={raw}" if len(raw) <= SHOWN_CHARS else f"{key}={raw[:SHOWN_CHARS]}… ({len(raw)} characters)"
    if key in SIZE_KEYS:
        return _check_size(said, value)
    if key in CHOICE_KEYS:
        return _check_choice(key, said, value)
    if key == "devices":
        if value == "auto" or (_is_int(value) and 1 <= value <= MAX_INT):
            return value
        raise ConfigError(f"{said}: expected a number of devices (1 or more) or auto.")
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{said}: expected true or false.")
    if isinstance(default, int):
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():  # too many digits for YAML
            raise ConfigError(f"{said}: too large; expected an integer up to {MAX_INT}.")
        if not _is_int(value):
            raise ConfigError(f"{said}: expected an integer (the preset's value is {default}).")
        if value < 0 or (value == 0 and key.endswith(("steps", "size", "layers", "hidden", "devices"))):
            raise ConfigError(f"{said}: expected a positive integer.")
        if value > MAX_INT:
            raise ConfigError(f"{said}: too large; expected an integer up to {MAX_INT}.")
        return value
    if isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:
                number = math.inf
            if math.isfinite(number):
                return number
        raise ConfigError(f"{said}: expected a number (the preset's value is {default}).")
    if isinstance(default, str):
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{said}: expected text (the preset's value is {default!r}).")
        return raw if value is None else str(value) if not isinstance(value, str) else value
    if default is None:
        return value
    raise ConfigError(f"{said}: expected {_type_name(default)}.")


def _check_choice(key: str, said: str, value: Any) -> str:
    """One of ``CHOICE_KEYS[key]``'s words, as typed (no case folding: DeepSpeed reads them as written)."""
    choices = CHOICE_KEYS[key]
    if isinstance(value, str) and value in choices:
        return value
    expected = f"expected one of {', '.join(choices)}"
    if key.startswith("zero.offload") and value == "nvme":
        raise ConfigError(f"{said}: offloading to NVMe needs a path for DeepSpeed's nvme_path, which the preset "
                          f"does not set; {expected}.")
    raise ConfigError(f"{said}: {expected}.")


def _check_size(said: str, value: Any) -> int | None:
    """A byte size above zero and at most ``MAX_SIZE``, or None (no limit)."""
    if value is None:
        return None
    expected = "expected a size such as 15GiB, 512MiB or 16GB (or null for no limit)"
    try:
        size = parse_size(value)
    except ValueError:
        raise ConfigError(f"{said}: {expected}.") from None
    if size == 0:
        raise ConfigError(f"{said}: a limit of 0 bytes leaves nothing to run in; {expected}.")
    if size > MAX_SIZE:
        raise ConfigError(f"{said}: more than any GPU or machine has (over 1 PiB); {expected}.")
    return size


def parse_limit(raw: str, key: str = "gpu_mem_limit") -> int | None:
    """``gpu_mem_limit=`` as typed outside a preset (a command's cap): bytes, None for null, or a ConfigError."""
    return _check_size(f"{key}={raw}", _parse_value(raw))


def split_overrides(args: Iterable[str]) -> tuple[str | None, list[tuple[str, str]]]:
    """``preset=NAME`` (or a bare first word) and the ``key=value`` pairs, in order."""
    preset: str | None = None
    pairs: list[tuple[str, str]] = []
    for i, arg in enumerate(args):
        if "=" not in arg:
            if i == 0 and preset is None:
                preset = arg
                continue
            raise ConfigError(f"{_shown(arg)}: expected key=value, e.g. max_steps=3 or model.n_layers=64.")
        key, _, raw = arg.partition("=")
        key = key.strip()
        if not key:
            raise ConfigError(f"{_shown(arg)}: the key before '=' is empty; expected key=value.")
        if key == "preset":
            preset = raw.strip()
        else:
            pairs.append((key, raw))
    return preset, pairs


def settable_keys(preset: Preset) -> dict[str, object]:
    """The dotted keys a user may set for ``preset``, with the preset's values."""
    return {k: v for k, v in flatten(preset.defaults).items() if k.split(".")[0] not in FIXED_KEYS}


def resolve(preset_name: str | None, overrides: Iterable[tuple[str, str]] = ()) -> dict[str, object]:
    """The preset's settings with the overrides applied, validated; ``preset`` added."""
    if not preset_name:
        raise ConfigError(
            f"which preset? e.g. shardtop launch preset=fsdp2-mlp\nPresets: {', '.join(preset_names())}."
        )
    preset = load_preset(preset_name)
    import copy

    config: dict[str, object] = copy.deepcopy(dict(preset.defaults))
    known = settable_keys(preset)
    overridden: list[str] = []
    for key, raw in overrides:
        if key.split(".")[0] in FIXED_KEYS:
            raise ConfigError(
                f"{_shown(key)} is part of the preset and cannot be overridden; choose another preset."
            )
        if key not in known:
            settable = list(known)
            from difflib import get_close_matches

            close = get_close_matches(key, settable, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"unknown key {_shown(key)} for preset {preset_name}.{hint}\nValid keys: {', '.join(settable)}."
            )
        value = _check(key, known[key], _parse_value(raw), raw)
        set_dotted(config, key, value)
        overridden.append(key)
    for key in SIZE_KEYS:
        if isinstance(size := config.get(key), str):
            config[key] = _check(key, None, size, size)
    config["preset"] = preset_name
    config["overrides"] = overridden
    return config


def apply_cpu_defaults(config: dict[str, object]) -> dict[str, object]:
    """The preset's ``on_cpu`` values, for every key the user did not set.

    A cap (``gpu_mem_limit``) in ``on_cpu`` stands for the question's card at the preset's CPU size: where
    the user sets a model size of their own, it does not apply (they give a cap of their own, or none).
    """
    import copy

    config = copy.deepcopy(config)
    overrides, on_cpu = config.get("overrides"), config.get("on_cpu")
    overridden = set(overrides) if isinstance(overrides, list) else set()
    resized = any(key.startswith("model.") for key in overridden)
    for key, value in flatten(on_cpu if isinstance(on_cpu, Mapping) else {}).items():
        if key == "gpu_mem_limit" and resized:
            continue
        if key not in overridden:
            set_dotted(config, key, _check_size(f"on_cpu: {key}={value}", value) if key in SIZE_KEYS else value)
    return config


class ZeroOffload(NamedTuple):
    """What a ZeRO preset offloads, as its keys say: each ``none`` or ``cpu`` (``OFFLOAD_DEVICES``)."""

    optimizer: str = "none"
    """DeepSpeed's ``zero_optimization.offload_optimizer.device``: the fp32 master copy and the optimizer's state."""
    param: str = "none"
    """``zero_optimization.offload_param.device``: ZeRO-3's parameter partitions."""

    @property
    def any(self) -> bool:
        return self.optimizer != "none" or self.param != "none"


def zero_offload(settings: Mapping[str, Any]) -> ZeroOffload:
    """A resolved preset's ``zero.offload_*`` keys; ``none`` where the preset has none."""
    zero = settings.get("zero")
    if not isinstance(zero, Mapping):
        return ZeroOffload()
    return ZeroOffload(optimizer=str(zero.get("offload_optimizer", "none")),
                       param=str(zero.get("offload_param", "none")))


class OnMachine(NamedTuple):
    """A resolved preset as a machine runs it: its settings, and the two that the machine fixed in them."""

    settings: dict[str, object]
    accelerator: str
    """cpu or cuda."""
    devices: int


def on_machine(config: Mapping[str, Any], gpus: int) -> OnMachine:
    """The config as a machine with ``gpus`` GPUs runs it: ``accelerator`` fixed to cpu or cuda and
    ``devices`` and ``world_size`` to numbers.

    ``accelerator=auto`` is cuda where there is a GPU, else cpu.  On CPU the preset's ``on_cpu`` values
    apply to the keys the user did not set, and ``devices=auto`` is ``CPU_DEFAULT_DEVICES`` processes; on
    GPUs it is every GPU (at least one).  Nothing is checked against the machine: ``shardtop launch``
    refuses what is not here, a plan does not need it to be.
    """
    out = dict(config)
    accelerator = out.get("accelerator", "auto")
    if accelerator == "auto":
        accelerator = "cuda" if gpus > 0 else "cpu"
    if accelerator == "cpu":
        out = apply_cpu_defaults(out)
    devices = out.get("devices", "auto")
    if devices == "auto":
        devices = CPU_DEFAULT_DEVICES if accelerator == "cpu" else max(1, gpus)
    if isinstance(devices, bool) or not isinstance(devices, int):
        raise ConfigError(f"devices={devices}: expected a number of processes, or auto.")
    out["accelerator"] = accelerator = str(accelerator)
    out["devices"] = devices
    out["world_size"] = 1 if out.get("single_process") else devices
    return OnMachine(out, accelerator, devices)
