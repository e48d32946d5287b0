"""Fixtures the fault scenarios share: the seed in every report, daemons as processes, a
plain server for the handlers' ledger, and producer threads stopped at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.test_faults import SEED, Fleet, Servers
from tests.reliability.test_scale_out import Stream
from tests.servers import Server


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
