"""Fixtures the fault scenarios share: the seed in every report, daemons as processes, a
scenario's set-up (tests/reliability/scenario.py), a plain server for the handlers'
ledger, producer threads stopped at the end, and a Sentinel group for failovers under
load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import require_binary
from tests.reliability.ledger import Ledger
from tests.reliability.scenario import SEED, Fleet, Scenario, Servers
from tests.reliability.test_scale_out import Stream
from tests.servers import Sentinels, Server


@pytest.fixture(autouse=True)
def seed_in_report(request: pytest.FixtureRequest) -> None:
    """Show the seed with any failure, so a run can be repeated with DUETIME_FAULT_SEED."""
    request.node.add_report_section("call", "seed", f"DUETIME_FAULT_SEED={SEED}")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    group = Fleet(tmp_path)
    try:
        yield group
    finally:
        group.close()


@pytest.fixture
def scenario(
    fleet: Fleet,
    server: Server,
    redis_url: str,
    raw: redis.Redis,
    queue_name: str,
    capsys: pytest.CaptureFixture[str],
) -> Iterator[Scenario]:
    """A fault scenario's set-up: its daemons, its queue on the session's server (emptied
    first), the ledger there, random choices from the seed; its producers halted at the
    end."""
    story = Scenario(
        fleet=fleet,
        server=server,
        ledger_url=redis_url,
        queue_name=queue_name,
        capsys=capsys,
        url=redis_url,
        client=raw,
        ledger=Ledger(raw),
    )
    try:
        yield story
    finally:
        story.close()


@pytest.fixture
def servers() -> Iterator[Servers]:
    group = Servers()
    try:
        yield group
    finally:
        group.close()


@pytest.fixture
def ledger_server() -> Iterator[Server]:
    """A plain server for the handlers' ledger, apart from the set-up under test."""
    group = Servers()
    try:
        yield group.start()
    finally:
        group.close()


@pytest.fixture
def streams() -> Iterator[list[Stream]]:
    started: list[Stream] = []
    try:
        yield started
    finally:
        for stream in started:
            if stream.is_alive():
                stream.halt()


@pytest.fixture
def sentinels() -> Iterator[Sentinels]:
    # Sentinel's down-after is 3 s, not 1 s: on a loaded host, 1 s let a sentinel judge a
    # busy or freshly promoted master down and fail over again on its own (to a killed
    # server just restarted empty: everything lost, and not by duetime), a fault the
    # verdict would not know.
    group = Sentinels("redis", require_binary("redis"), down_after_ms=3000)
    group.start()
    try:
        assert group.master is not None and group.replica is not None
        for server in (group.master, group.replica):
            # Either may be the master a demoted or restarted one syncs from: no 5 s
            # pause first.
            client = server.client()
            client.config_set("repl-diskless-sync-delay", 0)
            client.close()
        yield group
    finally:
        group.stop()
