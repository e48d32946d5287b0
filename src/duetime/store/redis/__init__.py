"""The redis-py half of the store, and the only code that talks to a server.

``runner`` runs plans, sync or asyncio, the way a request travels: its arguments on the
wire, scripts by SHA, cluster routing and pipelines, and redis-py's errors turned into
duetime's. Around it: ``connections`` makes the clients from a URL (one server, a
Cluster, or behind Sentinel), ``kept`` keeps a connection for script calls, ``failover``
and ``watched`` follow a Sentinel failover as it happens, ``bridge`` lets other threads
run plans on an asyncio runner, and ``cancel_signals`` hears cancels of running tasks."""
