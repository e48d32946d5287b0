"""The runners: executing plans on redis-py, sync or asyncio, on one server, a Cluster or
behind Sentinel, with redis-py's errors turned into duetime's. The only code that talks
to a server."""
