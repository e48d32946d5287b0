"""The Redis layer: the only part of duetime that issues Redis commands.

``keys`` names every key, ``scripts`` loads the Lua files, ``operations`` writes each
step once as a plan (a generator that yields ``requests``; the plans of each role in a
module of their own: ``producing``, ``dispatching``, ``working``, ``cron_jobs``,
``operating``, ``snapshot``, ``server_checks``), and ``runner`` executes plans on a
synchronous or an asyncio redis-py client (sending them with ``wire`` and ``routing``,
its errors translated by ``failures``). The client, the dispatcher and the worker call
operations through a runner and never see a Redis command.
"""

from duetime.store.keys import QueueKeys
from duetime.store.runner import AsyncRunner, SyncRunner, mask_url

__all__ = ["AsyncRunner", "QueueKeys", "SyncRunner", "mask_url"]
