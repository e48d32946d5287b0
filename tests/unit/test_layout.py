"""Where a sharded queue keeps a task: stable routing by id, cron ticks with their job,
shard tags that no queue name can take."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime import validation
from duetime.errors import ConfigurationError, InvalidNameError
from duetime.store.plans.layout import QueueLayout, shard_tag


def test_shard_zero_is_the_queue_itself_so_an_unsharded_queue_is_its_first_shard() -> None:
    layout = QueueLayout("emails", 3)
    assert [keys.queue for keys in layout.shards] == ["emails", "emails#1", "emails#2"]
    assert layout.shards[0] == QueueLayout("emails").shards[0]
    assert layout.beyond.queue == "emails#3"
    assert layout.shards[1].ready == "duetime:{emails#1}:ready"


def test_no_queue_name_can_be_a_shard_tag() -> None:
    with pytest.raises(InvalidNameError):
        validation.queue_name(shard_tag("emails", 1))


def test_the_shard_of_an_id_is_a_crc32_of_it_and_the_same_in_every_process() -> None:
    layout = QueueLayout("emails", 8)
    # Fixed values: a change here would strand every task already written.
    assert zlib.crc32(b"order-1") % 8 == layout.of_task("order-1") == 7
    assert layout.of_task("order-2") == zlib.crc32(b"order-2") % 8


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=40))
def test_a_cron_tick_lives_in_the_shard_of_its_job(name: str) -> None:
    layout = QueueLayout("q", 7)
    assert layout.of_task(f"cron:{name}:1700000000000") == layout.of_cron(name)


def test_ids_spread_over_every_shard() -> None:
    layout = QueueLayout("q", 8)
    counts = [0] * 8
    for n in range(8000):
        counts[layout.of_task(f"task-{n}")] += 1
    assert min(counts) > 800 and max(counts) < 1200, counts


def test_one_shard_puts_everything_in_shard_zero() -> None:
    layout = QueueLayout("q")
    assert {layout.of_task(f"t{n}") for n in range(100)} == {0}
    assert layout.of_cron("nightly") == 0


@pytest.mark.parametrize("bad", [0, -1, 257, 2.0, True, "4", None])
def test_a_shard_count_out_of_range_is_refused(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="shards must be an integer from 1 to 256"):
        validation.shards(bad)
