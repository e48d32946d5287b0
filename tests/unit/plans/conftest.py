"""The plan objects the tests drive, made in one place: queue "q" on a manual clock that
reads NOW_MS (so no plan asks the server for TIME unless a test gives it a clock that
does). Each group of plans a test module drives is a fixture of its own, taken from the
one ``operations`` fixture."""

from __future__ import annotations

import pytest

from duetime.clock import ManualClock
from duetime.store.plans.cron_jobs import CronPlans
from duetime.store.plans.dispatching import DispatcherPlans
from duetime.store.plans.flow_control import FlowPlans
from duetime.store.plans.history import HistoryPlans
from duetime.store.plans.keyed import KeyedPlans
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operating import OperatorPlans
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.producing import ProducerPlans
from duetime.store.plans.searching import SearchPlans
from duetime.store.plans.server_checks import ServerCheckPlans
from duetime.store.plans.snapshot import SnapshotPlans
from duetime.store.plans.working import WorkerPlans
from tests.unit.plans.scripted import NOW_MS


@pytest.fixture
def keys() -> QueueKeys:
    return QueueKeys("q")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW_MS)


@pytest.fixture
def operations(keys: QueueKeys, clock: ManualClock) -> QueueOperations:
    return QueueOperations(keys, clock)


@pytest.fixture
def producer(operations: QueueOperations) -> ProducerPlans:
    return operations.producer


@pytest.fixture
def dispatcher(operations: QueueOperations) -> DispatcherPlans:
    return operations.dispatcher


@pytest.fixture
def history(operations: QueueOperations) -> HistoryPlans:
    return operations.history


@pytest.fixture
def search(operations: QueueOperations) -> SearchPlans:
    return operations.search


@pytest.fixture
def server_checks(operations: QueueOperations) -> ServerCheckPlans:
    return operations.server


@pytest.fixture
def snapshots(operations: QueueOperations) -> SnapshotPlans:
    return operations.snapshot


@pytest.fixture
def worker(operations: QueueOperations) -> WorkerPlans:
    return operations.worker


@pytest.fixture
def flow(operations: QueueOperations) -> FlowPlans:
    return operations.flow


@pytest.fixture
def keyed(operations: QueueOperations) -> KeyedPlans:
    return operations.keyed


@pytest.fixture
def operator(operations: QueueOperations) -> OperatorPlans:
    return operations.operator


@pytest.fixture
def cron(operations: QueueOperations) -> CronPlans:
    return operations.cron
