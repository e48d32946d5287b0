"""What a queue asks of the server that holds it, checked at start-up: whether it can
confirm fsyncs (for durable_fsync) and which eviction policy it runs."""

from __future__ import annotations

from duetime.errors import ConfigurationError, RedisCommandError
from duetime.store.plans.base import QueuePlans
from duetime.store.plans.replies import as_text
from duetime.store.plans.requests import Command, Plan


class ServerCheckPlans(QueuePlans):
    """The plans that look at the server of a queue rather than at the queue."""

    def check_fsync(self) -> Plan[None]:
        """ConfigurationError unless this queue's server can confirm fsyncs (WAITAOF,
        with appendonly on), as durable_fsync needs. Waits a millisecond at most."""
        reply = yield Command(("WAITAOF", 1, 0, 1), route=self.keys.tasks, refusal_as_reply=True)
        if isinstance(reply, RedisCommandError):
            raise ConfigurationError(
                f"durable_fsync cannot be used: {reply}. It needs WAITAOF (Redis or Valkey "
                "7.2 and later) and appendonly yes on the master; change the server, or turn "
                "durable_fsync off"
            )

    def eviction_policy(self) -> Plan[str]:
        reply = yield Command(("CONFIG", "GET", "maxmemory-policy"), route=self.keys.tasks)
        values = list(reply.values()) if isinstance(reply, dict) else reply[1::2]
        return as_text(values[0]) if values else "unknown"
