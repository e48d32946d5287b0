"""What a queue asks of its server at start-up (store/plans/server_checks.py): whether it
can confirm fsyncs, and its eviction policy, from each shape of reply."""

from __future__ import annotations

import pytest

from duetime.errors import ConfigurationError, RedisCommandError
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.requests import Command
from duetime.store.plans.server_checks import ServerCheckPlans
from tests.unit.plans.scripted import run_plan


def waitaof(keys: QueueKeys) -> Command:
    # On the queue's node, waiting a millisecond at most, the refusal as the reply.
    return Command(("WAITAOF", 1, 0, 1), route=keys.tasks, refusal_as_reply=True)


def test_fsync_check_passes_when_the_server_answers_waitaof(
    server_checks: ServerCheckPlans, keys: QueueKeys
) -> None:
    assert run_plan(server_checks.check_fsync(), (waitaof(keys), [1, 0])) is None


def test_fsync_check_turns_a_refusal_into_a_configuration_error(
    server_checks: ServerCheckPlans, keys: QueueKeys
) -> None:
    refusal = RedisCommandError(
        "ERR WAITAOF cannot be used when numlocal is set but appendonly is disabled"
    )
    with pytest.raises(ConfigurationError) as raised:
        run_plan(server_checks.check_fsync(), (waitaof(keys), refusal))
    message = str(raised.value)
    assert "durable_fsync cannot be used" in message and "appendonly is disabled" in message


def policy(keys: QueueKeys) -> Command:
    return Command(("CONFIG", "GET", "maxmemory-policy"), route=keys.tasks)


@pytest.mark.parametrize(
    "reply",
    [{b"maxmemory-policy": b"allkeys-lru"}, [b"maxmemory-policy", b"allkeys-lru"]],
    ids=["dict", "flat list"],
)
def test_eviction_policy_reads_either_reply_shape(
    server_checks: ServerCheckPlans, keys: QueueKeys, reply: object
) -> None:
    assert run_plan(server_checks.eviction_policy(), (policy(keys), reply)) == "allkeys-lru"


@pytest.mark.parametrize("reply", [{}, []], ids=["dict", "flat list"])
def test_eviction_policy_is_unknown_when_the_server_names_none(
    server_checks: ServerCheckPlans, keys: QueueKeys, reply: object
) -> None:
    """A server that hides CONFIG's answer (a managed service's renamed command)."""
    assert run_plan(server_checks.eviction_policy(), (policy(keys), reply)) == "unknown"
