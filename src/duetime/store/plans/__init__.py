"""The plans: every step duetime takes on Redis, written once and free of redis-py.

``keys`` and ``layout`` name every key and say where a task lives; ``lua/`` holds one
script per state change, which ``scripts`` loads; a plan is a generator that yields
``requests`` and reads the ``replies``. The plans of each role have a module of their
own (``producing``, ``dispatching``, ``working``, ``cron_jobs``, ``operating``,
``snapshot``, ``server_checks``, ``flow_control``, ``searching``, ``keyed``,
``history``); ``operations`` joins them for one queue. Nothing here imports redis: the
runners of ``duetime.store.redis`` execute the plans.
"""
