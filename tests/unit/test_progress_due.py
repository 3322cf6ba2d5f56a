"""When the live progress reads the run: the table twice a second on a terminal, a line every five seconds otherwise."""

from __future__ import annotations

from metarl_cli.progress import LINE_EVERY_S, LIVE_REFRESH_S, display_due


def test_the_first_tick_is_always_shown() -> None:
    assert display_due(100.0, None, live=True, finished=False)
    assert display_due(100.0, None, live=False, finished=False)


def test_the_table_refreshes_at_its_rate() -> None:
    assert not display_due(100.0 + LIVE_REFRESH_S / 2, 100.0, live=True, finished=False)
    assert display_due(100.0 + LIVE_REFRESH_S, 100.0, live=True, finished=False)


def test_lines_are_read_only_when_one_is_printed() -> None:
    assert not display_due(100.0 + LIVE_REFRESH_S, 100.0, live=False, finished=False)
    assert not display_due(100.0 + LINE_EVERY_S - 0.01, 100.0, live=False, finished=False)
    assert display_due(100.0 + LINE_EVERY_S, 100.0, live=False, finished=False)
    assert display_due(100.0 + 0.01, 100.0, live=False, finished=True)  # the run's end is always printed
