"""Which bytes of a description a strategy's activations are (pure, no torch).

Under autocast (Lightning's and accelerate's "-mixed" for one device, DDP and FSDP) each saved tensor is
counted in the dtype the forward traced as under autocast saved it (``saved_autocast_upto``); DeepSpeed's
fp16 and bf16 make the model half precision, so every saved element is 2 bytes there; a description without
those figures (an older one, or a forward the casts could not run) falls back to 2 bytes an element too.
"""

from __future__ import annotations

from shardtop.plan.description import ModelDescription
from shardtop.plan.saved import activations_before, saved_activations
from shardtop.plan.strategies import Strategy

ELEMENTS, OTHER, INPUT = 1_000, 64, 512
UNDER_AUTOCAST = 2_600
"""Bytes: 700 elements saved in half precision, 300 in fp32."""


def description(autocast: list[int] | None = None) -> ModelDescription:
    """A root and two children: the root saves 100 elements (its loss, 400 bytes under autocast), ``a`` 400
    (800 bytes) and ``b`` 500 (1400 bytes: some of it fp32)."""
    return ModelDescription(
        name="net", names=["", "a", "b"], parents=[-1, 0, 0], end=[3, 2, 3], types=["Net", "Linear", "Linear"],
        numel_upto=[0, 0, 10, 20], small_upto=[0, 0, 0, 0], small_threshold=1024, largest_param=10,
        dtype_bytes=4, buffer_bytes=0, repeated_blocks=[], saved_float_upto=[0, 100, 500, ELEMENTS],
        saved_other_upto=[0, 0, 0, OTHER], largest_output=10, input_bytes=INPUT, batch_size=1,
        saved_autocast_upto=[0, 400, 1200, UNDER_AUTOCAST] if autocast is None else autocast,
    )


def test_autocast_counts_each_saved_tensor_in_its_own_dtype() -> None:
    for engine in ("single", "ddp", "fsdp1", "fsdp2"):
        s = Strategy(engine=engine, precision="bf16-mixed")
        assert s.autocast
        assert saved_activations(description(), s) == UNDER_AUTOCAST + OTHER + INPUT


def test_deepspeeds_half_model_and_fsdps_units_alone_count_as_before() -> None:
    zero = Strategy(engine="zero3", precision="bf16-mixed")
    assert not zero.autocast
    assert saved_activations(description(), zero) == 2 * ELEMENTS + OTHER + INPUT
    units_only = Strategy(engine="fsdp1", precision="fp16-mixed", half_in_units_only=True, units=(1, 2))
    assert not units_only.autocast
    assert saved_activations(description(), units_only) == 4 * 100 + 2 * 900 + OTHER + INPUT
    assert saved_activations(description(), Strategy(engine="ddp")) == 4 * ELEMENTS + OTHER + INPUT


def test_a_description_without_autocasts_figures_counts_two_bytes_an_element() -> None:
    s = Strategy(engine="ddp", precision="fp16-mixed")
    assert saved_activations(description(autocast=[]), s) == 2 * ELEMENTS + OTHER + INPUT


def test_the_activations_before_a_row_leave_the_roots_own_out_under_autocast_too() -> None:
    s = Strategy(engine="fsdp2", precision="bf16-mixed")
    assert activations_before(description(), s, [1, 2]) == [INPUT, 800 + INPUT]
    assert activations_before(description(autocast=[]), s, [1, 2]) == [INPUT, 2 * 400 + INPUT]
