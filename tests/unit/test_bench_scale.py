"""bench.scale's memory figures: each part's warm-up left out, the slope only where every part was measured."""

from __future__ import annotations

import math

from bench.scale import FLAT_KIB_PER_1000, WARM_UP_S, PipelinePart, measured_samples, memory_summary, memory_verdict, slope_kib_per_1000


def part(name: str, start_episodes: int, rss_of: list[int], step_s: float = 0.5, episodes_per_sample: int = 10) -> PipelinePart:
    samples = [(i * step_s, rss, start_episodes + i * episodes_per_sample) for i, rss in enumerate(rss_of)]
    return PipelinePart(name, episodes=len(rss_of) * episodes_per_sample, seconds=len(rss_of) * step_s, samples=samples)


def test_the_warm_up_is_left_out_of_each_part() -> None:
    warming = [80_000 + 500 * i for i in range(20)] + [95_000] * 30  # grows for the first 10 s, then flat
    one = part("p1", 0, warming)
    assert all(t >= WARM_UP_S for t, _, _ in measured_samples(one))
    first, median, peak, last = memory_summary(one)
    assert first == median == peak == last == 95_000 / 1024


def test_a_process_that_only_warmed_up_is_not_measured() -> None:
    short = part("p1", 0, [80_000 + 500 * i for i in range(14)])  # 7 s: all warm-up
    long = part("p2", 100_000, [90_000 + 300 * i for i in range(60)])
    assert math.isnan(slope_kib_per_1000([short, long]))
    assert memory_verdict(slope_kib_per_1000([short, long])).startswith("NOT MEASURED")
    assert memory_summary(short)[0] == 80_000 / 1024  # the table still shows something: all its samples


def test_flat_parts_meet_the_target_and_growth_with_the_run_misses_it() -> None:
    flat = [part("p1", 0, [92_000] * 60), part("p2", 100_000, [92_100] * 60)]
    assert abs(slope_kib_per_1000(flat)) < FLAT_KIB_PER_1000 and memory_verdict(slope_kib_per_1000(flat)) == "met"
    grown = [part("p1", 0, [92_000] * 60), part("p2", 100_000, [92_000 + 200_000] * 60)]  # 200 MB more at 100,000 episodes
    assert slope_kib_per_1000(grown) > FLAT_KIB_PER_1000 and memory_verdict(slope_kib_per_1000(grown)) == "MISSED"
