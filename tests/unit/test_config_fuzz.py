"""Whatever a user types as settings, shardtop answers with a config or a message: never a traceback."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtop.config import (
    MAX_INT,
    MAX_SIZE,
    ConfigError,
    load_preset,
    preset_names,
    resolve,
    settable_keys,
    split_overrides,
)
from shardtop.launch import CpuRoom, resolve_devices

PRESETS = preset_names()
KEYS = sorted({key for name in PRESETS for key in settable_keys(load_preset(name))})
"""Every key some preset takes, so the fuzzer mostly reaches the value checks."""

# what people type, and what breaks parsers: YAML syntax, huge and odd numbers, paths, control characters
nasty_values = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        ["", "null", "~", "true", "auto", "-1", "0", "1e400", "1.0e400", ".inf", ".nan", "0x10", "0o17", "1_000",
         "[1, 2]", "{a: 1}", "!!python/object:os.system", "&a [*a]", "'", '"', "[" * 500, "- - -", "2024-01-01",
         "15GiB", "15 potatoes", "0GiB", "16PB", "9" * 5000, "-" + "9" * 30, "1." + "9" * 400, "../../etc/passwd",
         "\x00", "\x15", "é", "=", "a=b"]
    ),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)


@st.composite
def preset_with_overrides(draw: st.DrawFn) -> list[str]:
    """A real preset and overrides of its own keys: reaches every value check."""
    preset = draw(st.sampled_from(PRESETS))
    keys = sorted(settable_keys(load_preset(preset)))
    pairs = draw(st.lists(st.tuples(st.sampled_from(keys), nasty_values), min_size=1, max_size=4))
    return [draw(st.sampled_from([preset, f"preset={preset}"])), *(f"{k}={v}" for k, v in pairs)]


anything = st.lists(
    st.one_of(
        st.sampled_from(PRESETS),
        st.sampled_from(["presets/fsdp2-mlp.yaml", "/tmp/../fsdp2-mlp", "./fsdp2-mlp", "fsdp2-mlp.yaml"]),
        st.tuples(st.sampled_from(KEYS), nasty_values).map(lambda kv: f"{kv[0]}={kv[1]}"),
        st.tuples(st.text(max_size=20), nasty_values).map(lambda kv: f"{kv[0]}={kv[1]}"),
        st.text(max_size=30),
    ),
    max_size=6,
)
"""Any words at all, as a user might paste them."""


def _resolve(words: list[str], gpus: int) -> dict:
    preset, overrides = split_overrides(words)
    return resolve_devices(resolve(preset, overrides), lambda: gpus, lambda: CpuRoom(cores=2, memory=24 * 2**30))


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.one_of(preset_with_overrides(), preset_with_overrides(), anything), gpus=st.sampled_from([0, 2]))
def test_any_settings_give_a_config_or_a_message(words: list[str], gpus: int) -> None:
    try:
        config = _resolve(words, gpus)
    except ConfigError as e:
        message = str(e)
        assert message.strip(), "an error says what was wrong"
        assert len(message) < 2000, "an error quotes what was typed, cut short"
        return
    # a config that resolved is one a run can start from: typed, bounded, and storable in run.json
    assert config["preset"] in PRESETS
    assert config["accelerator"] in ("cpu", "cuda")
    assert isinstance(config["world_size"], int) and 1 <= config["world_size"] <= max(gpus, 8)
    limit = config.get("gpu_mem_limit")
    assert limit is None or (isinstance(limit, int) and 0 < limit <= MAX_SIZE)
    for key in config.get("overrides", ()):
        node = config
        for part in key.split("."):
            node = node[part]
        if isinstance(node, int) and not isinstance(node, bool):
            assert abs(node) <= MAX_INT
    json.dumps(config, default=str)
