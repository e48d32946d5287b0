"""How the dashboard writes a rate: the text it puts in a form must read back, through
``Rate.parse``, as exactly the rate it came from (saving a form unchanged changes
nothing), for every period a rate may have, from 1 ms to 30 days."""

from __future__ import annotations

import pytest

from duetime import Rate
from duetime.dashboard.formatting import rate_shown, rate_text

PERIODS_MS = [1, 7, 250, 1000, 1500, 2000, 60_000, 90_000, 120_000, 3_600_000, 5_400_000,
              86_400_000, 30 * 86_400_000]  # fmt: skip


@pytest.mark.parametrize("period_ms", PERIODS_MS)
def test_a_rate_written_for_a_form_reads_back_the_same(period_ms: int) -> None:
    rate = Rate(7, period_ms / 1000, burst=3)
    assert Rate.parse(rate_text(rate), burst=3).wire() == rate.wire()


def test_rates_read_as_people_write_them() -> None:
    assert rate_text(Rate(10)) == "10/s"
    assert rate_text(Rate(600, 60.0)) == "600/min"
    assert rate_text(Rate(5, 120.0)) == "5/2min"
    assert rate_text(Rate(3, 0.25)) == "3/250ms"
    assert rate_text(None) == ""
    assert rate_shown(Rate(100, 3600.0, burst=20)) == "100/h (burst 20)"
    assert rate_shown(None) == "none"
