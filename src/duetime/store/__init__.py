"""The Redis layer: the only part of duetime that issues Redis commands.

Two halves: ``plans`` writes each step once as a generator of requests, with the keys,
the layout and the Lua scripts, and imports no redis; ``redis`` runs those plans on a
synchronous or an asyncio redis-py client. The client, the dispatcher and the worker
call plans through a runner and never see a Redis command.
"""
