"""Hearing of cancels of running tasks as they are asked: ``cancel_task.lua`` publishes
the id of a running task it marks on its queue's channel (``QueueKeys.cancel_channel``),
and a worker listens on its queues' channels to stop such an attempt at once.

The heartbeat, which reads the marks themselves, stays the reliable path: a signal
missed (sent before the listener subscribed at the worker's start or while it
reconnects, before the attempt was registered, or on the other side of a failover) is
heard at the next heartbeat. On a cluster a message
published on one node reaches subscribers on every node. When Sentinel names another
master, the failover watcher shuts down the subscription's socket (``watched``), so the
listener subscribes again on the new master within about a second of the switch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import redis

from duetime.backoff import Backoff, Outage
from duetime.store.plans.replies import as_text
from duetime.store.redis.runner import AsyncRunner

log = logging.getLogger("duetime.worker")

#: How often the listener looks whether it should stop, while no message comes.
_POLL_SECONDS = 1.0


class CancelListener:
    """Listens on some cancel channels on a connection of its own (from the runner's
    pool for blocking commands), reconnecting after an error."""

    def __init__(self, runner: AsyncRunner, channels: Sequence[str], what: str) -> None:
        self._runner = runner
        self._channels = list(channels)
        self._outage = Outage(log, f"{what} cancel signals")

    async def listen(self, heard: Callable[[str, str], None], closing: asyncio.Event) -> None:
        """Call ``heard(channel, task id)`` for each cancel published on the channels,
        until ``closing`` is set. Refused by the server (an ACL without the channels, a
        proxy without pub/sub), it logs why once and stops: cancels are then heard at
        the heartbeat."""
        backoff = Backoff()
        while not closing.is_set():
            client = self._runner.blocking_client
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                if self._runner.clustered:
                    await client.initialize()  # the asyncio client learns the slots lazily
                await pubsub.subscribe(*self._channels)
                self._outage.succeeded()
                backoff.reset()
                await self._read(pubsub, heard, closing)
            except redis.ResponseError as refusal:
                log.warning(
                    "cancels of running tasks will be heard at the heartbeat only: the "
                    "server refused to subscribe to %s (%s); grant the worker's user "
                    "`+subscribe &duetime:*` (docs/security.md)",
                    ", ".join(self._channels),
                    refusal,
                )
                return
            except (redis.RedisError, OSError) as error:
                delay = backoff.next()
                self._outage.failed(error, delay)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await closing.wait()
            except Exception:
                # A fast path only: whatever else goes wrong here must not stop the
                # worker (its supervisor would give up on a part that keeps failing).
                log.exception("cancels of running tasks will be heard at the heartbeat only")
                return
            finally:
                with contextlib.suppress(redis.RedisError, OSError):
                    await pubsub.aclose()

    @staticmethod
    async def _read(pubsub: Any, heard: Callable[[str, str], None], closing: asyncio.Event) -> None:
        while not closing.is_set():
            message = await pubsub.get_message(
                ignore_subscribe_messages=True, timeout=_POLL_SECONDS
            )
            if message is not None and message.get("type") == "message":
                heard(as_text(message["channel"]), as_text(message["data"]))
