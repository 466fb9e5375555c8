"""Memory growth from step to step, as the pure fit sees it: a steady rise, and what is not one."""

from __future__ import annotations

from shardtop.read.memory_growth import StepMemory, growth

MiB = 2**20


def series(values: list[int], seconds: float = 0.5) -> list[StepMemory]:
    return [StepMemory(step=i + 1, bytes=v, t=100.0 + i * seconds) for i, v in enumerate(values)]


def test_a_steady_rise_gives_its_rate_and_the_step_it_reaches_the_limit() -> None:
    base = 2000 * MiB
    g = growth(series([base + 244 * MiB * i for i in range(30)]), limit=9 * 1024 * MiB)
    assert g is not None
    assert abs(g.rate - 244 * MiB) < 1
    assert (g.first_step, g.last_step) == (3, 30)
    last = base + 244 * MiB * 29
    assert g.steps_left == (9 * 1024 * MiB - last) // (244 * MiB)
    assert g.out_of_memory_step == 30 + g.steps_left + 1
    assert g.seconds_per_step == 0.5


def test_warm_up_then_flat_is_not_growth() -> None:
    # Adam's state made at step 1, a cache filled at step 2, then flat
    assert growth(series([100 * MiB, 400 * MiB, 450 * MiB] + [450 * MiB] * 20)) is None


def test_a_rise_that_stops_is_not_growth() -> None:
    rising = [100 * MiB + 50 * MiB * i for i in range(10)]
    assert growth(series(rising + [rising[-1]] * 10)) is None


def test_noise_is_not_growth() -> None:
    wobble = [500 * MiB + (3 * MiB if i % 2 else 0) for i in range(30)]
    assert growth(series(wobble)) is None
    tiny = [500 * MiB + 100_000 * i for i in range(30)]  # 3 MB over 30 steps: allocator rounding
    assert growth(series(tiny)) is None


def test_too_few_steps_say_nothing() -> None:
    assert growth(series([100 * MiB * i for i in range(1, 8)])) is None
    assert growth(series([100 * MiB * i for i in range(1, 10)])) is not None
