"""Training-time caps drawn per group (metarl/domain/time_caps.py)."""

from __future__ import annotations

from collections import Counter

from metarl.domain.time_caps import group_time_cap


def test_no_choices_leave_the_tasks_own_cap() -> None:
    assert group_time_cap([], 0, 5) is None


def test_a_group_always_gets_the_same_cap_and_every_choice_comes_up_about_as_often() -> None:
    choices = [20.0, 60.0, 40.0]
    drawn = Counter(group_time_cap(choices, 3, group) for group in range(1, 601))
    assert set(drawn) == set(choices) and min(drawn.values()) > 150
    assert all(group_time_cap(choices, 3, group) == group_time_cap(choices, 3, group) for group in range(50))
    assert [group_time_cap(choices, 3, g) for g in range(30)] != [group_time_cap(choices, 4, g) for g in range(30)]
