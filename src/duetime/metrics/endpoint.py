"""The metrics endpoint: ``MetricsServer`` serves a registry over HTTP from a thread of
its own, ``MetricsEndpoint`` puts the queue and cron collectors of some daemons on a
registry, and ``export()``, called by ``Worker.run`` and ``Dispatcher.run`` when
``Settings.metrics_port`` is set, serves one endpoint per process, shared by its
daemons, started by the first and stopped after the last."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from duetime.errors import ConfigurationError
from duetime.metrics.cron import CronCollector, CronTickSource
from duetime.metrics.queues import QueueCollector
from duetime.metrics.series import process_registry
from duetime.settings import Settings
from duetime.store.redis.runner import RedisSpec

log = logging.getLogger("duetime.metrics")

#: Where the endpoint listens unless $DUETIME_METRICS_ADDRESS says otherwise: the
#: endpoint has no authentication and names queues, tasks and cron jobs, so it is not
#: offered to the network unless asked (0.0.0.0 in a container, say).
DEFAULT_ADDRESS = "127.0.0.1"
ADDRESS_VARIABLE = "DUETIME_METRICS_ADDRESS"
#: Closing the endpoint: how often it is woken up to see the request, and for how long.
POLL_INTERVAL = 0.05
CLOSE_WITHIN = 2.0


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never holds the process's exit


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a request every scrape interval is not news


class MetricsServer:
    """An HTTP endpoint serving ``registry`` from a thread of its own. ``port`` 0 takes a
    free port (see ``.port``). Raises ConfigurationError when it cannot listen."""

    def __init__(self, registry: CollectorRegistry, port: int, address: str = DEFAULT_ADDRESS):
        server = _Server6 if ":" in address else _Server
        try:
            self._httpd = make_server(
                address, port, make_wsgi_app(registry), server, handler_class=_QuietHandler
            )
        except OSError as error:
            raise ConfigurationError(
                f"cannot serve metrics on {address}:{port}: {error.strerror or error}. Give "
                "each process a free port (Settings.metrics_port, $DUETIME_METRICS_PORT, "
                f"--metrics-port) or an address of this host (${ADDRESS_VARIABLE})"
            ) from None
        self.address = address
        # No poll interval: the thread sleeps until a request comes (a thread that wakes
        # on a timer takes the GIL from a busy worker each time); close() sends one.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": None},
            name="duetime-metrics",
            daemon=True,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_port)

    def close(self) -> None:
        stopping = threading.Thread(target=self._httpd.shutdown, daemon=True)
        stopping.start()
        # serve_forever looks at the shutdown request only once a request woke it up.
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.address, self.address)
        deadline = time.monotonic() + CLOSE_WITHIN
        while stopping.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection((host, self.port), timeout=POLL_INTERVAL).close()
            stopping.join(POLL_INTERVAL)
        self._httpd.server_close()
        self._thread.join(timeout=POLL_INTERVAL)


class MetricsEndpoint:
    """The queue and cron collectors of some daemons on a registry, and the HTTP endpoint
    serving it once ``start()``-ed. One per process serves the daemons (``export``);
    more may be made, each on its own registry (default: a fresh one)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.queues = QueueCollector()
        self.cron = CronCollector()
        self.server: MetricsServer | None = None
        self.registry.register(self.queues)
        self.registry.register(self.cron)

    def start(self, port: int, address: str = DEFAULT_ADDRESS) -> MetricsEndpoint:
        """Listen on ``address``:``port``; raises ConfigurationError when it cannot."""
        self.server = MetricsServer(self.registry, port, address)
        return self

    @property
    def port(self) -> int | None:
        return None if self.server is None else self.server.port

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        self.registry.unregister(self.queues)
        self.registry.unregister(self.cron)
        self.queues.close()


@dataclass(slots=True)
class _Exported:
    endpoint: MetricsEndpoint
    port: int  # the port asked for
    users: int = 0


_process_lock = threading.Lock()
_process: _Exported | None = None


def export(
    settings: Settings,
    redis: RedisSpec,
    queues: Sequence[str],
    shards: int = 1,
    dispatchers: Sequence[CronTickSource] = (),
) -> Callable[[], None]:
    """Export a daemon's queues (and its dispatchers' cron ticks) on this process's
    endpoint, on ``settings.metrics_port``: the first daemon starts it, the others share
    it. Returns the function that takes them back; after the last, the endpoint stops.
    An endpoint that cannot listen (the port is taken) is logged, never fatal: the
    daemon's work matters more than its metrics."""
    global _process
    with _process_lock:
        exported = _process
        if exported is None:
            exported = _Exported(MetricsEndpoint(process_registry()), settings.metrics_port)
            _process = exported
            address = os.environ.get(ADDRESS_VARIABLE) or DEFAULT_ADDRESS
            try:
                exported.endpoint.start(settings.metrics_port, address)
                log.info("serving metrics on http://%s:%d/metrics", address, settings.metrics_port)
            except ConfigurationError as error:
                log.error("%s; this process exports no metrics", error)
        elif settings.metrics_port != exported.port:
            log.warning(
                "metrics are served on port %d already (one endpoint per process); "
                "metrics_port %d is ignored",
                exported.port,
                settings.metrics_port,
            )
        exported.users += 1
    endpoint = exported.endpoint
    for queue in queues:
        endpoint.queues.add(queue, redis, settings=settings, shards=shards)
    endpoint.cron.add(dispatchers)
    released = threading.Event()

    def unexport() -> None:
        global _process
        if released.is_set():
            return
        released.set()
        endpoint.cron.remove(dispatchers)
        for queue in queues:
            endpoint.queues.remove(queue)
        with _process_lock:
            exported.users -= 1
            if exported.users == 0:
                # Closed under the lock: a daemon starting now must find the port free.
                endpoint.close()
                _process = None

    return unexport
