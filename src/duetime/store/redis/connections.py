"""How duetime connects: from a URL or a redis-py client object to the two clients a
runner uses, one for ordinary commands (short socket timeout) and one for blocking
commands (a socket timeout longer than the longest block).

Supported, with redis-py's own clients doing the work (nothing home-made in between):
- one server: ``redis://``, ``rediss://`` (TLS), ``unix://``, or a ``redis.Redis`` /
  ``redis.asyncio.Redis`` client;
- Sentinel: ``redis+sentinel://[user:pass@]host:port[,host:port...]/service[/db]``
  (``rediss+sentinel://`` for TLS to the master; ``?sentinel_password=...`` when the
  sentinels ask for one), or a client from ``Sentinel(...).master_for(...)``: a
  watcher follows the sentinels' events (``failover.py``), holds sends while a replica
  is being promoted and moves every connection to the new master once it is named; a
  READONLY reply (a demoted master) drops the connection too;
- Redis Cluster: ``redis+cluster://[user:pass@]host:port[,host:port...]`` (or
  ``rediss+cluster://``), or a ``RedisCluster`` client: redis-py routes each command by
  its key's slot and follows MOVED/ASK. Every key of a queue shares one hash tag, so a
  queue lives in one slot; commands that name no key (TIME, SCAN, CONFIG GET) are sent
  to the node of the queue's slot (``Command.route``).
Only the address, credentials and TLS settings are taken from a client object given;
timeouts, retries and the protocol are duetime's.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from duetime.errors import ConfigurationError
from duetime.settings import Settings
from duetime.store.redis.failover import watcher_for
from duetime.store.redis.watched import watched_classes

#: Extra seconds a blocking command's socket waits beyond the block itself.
BLOCK_MARGIN = 5.0

_ADDRESS_KWARGS = frozenset(
    {"host", "port", "db", "username", "password", "path", "client_name", "credential_provider"}
)
_AUTH_KWARGS = frozenset({"username", "password", "credential_provider"})

RedisSpec = (
    str
    | redis.Redis
    | redis.asyncio.Redis
    | redis.cluster.RedisCluster
    | redis.asyncio.cluster.RedisCluster
    | None
)


@dataclass(frozen=True, slots=True)
class Connection:
    main: Any  # ordinary commands
    blocking: Any  # BLMOVE, BLPOP: a longer socket timeout
    address: str  # printable, password masked
    clustered: bool  # a RedisCluster client: keyless commands need a route
    helpers: tuple[Any, ...] = ()  # more clients to close with these (the sentinels')
    closing: tuple[Callable[[], None], ...] = ()  # called once these are closed
    #: When (time.monotonic) commands were last held by a failover; 0.0 if never.
    interrupted_at: Callable[[], float] = float


def mask_url(url: str) -> str:
    """The URL with any password replaced by ***."""
    # Whitespace ends a URL: never reach past it into whatever text follows.
    url = re.sub(r"(://)[^:/@\s]+@", r"\1***@", url)
    url = re.sub(r"(://[^:/@\s]*:)[^@/\s]*@", r"\1***@", url)
    return re.sub(r"(?i)([?&](?:sentinel_)?password=)[^&#\s]*", r"\1***", url)


# A URL in free text: a scheme, then everything up to whitespace or a closing quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def mask_urls_in(text: str) -> str:
    """``text`` with the password of each URL in it masked, and every other word left whole
    (a server's error message is the user's best clue: an ``@`` in it is not a password)."""
    return _URL_IN_TEXT.sub(lambda found: mask_url(found.group()), text)


def resolve_url(spec: str | None) -> str:
    """An explicit URL, else $DUETIME_REDIS_URL, else the embedded server's."""
    if spec:
        return spec
    from_env = os.environ.get("DUETIME_REDIS_URL")
    if from_env:
        return from_env
    from duetime.embedded import ensure_server

    return ensure_server().url


def embedded_wanted(spec: RedisSpec) -> bool:
    """Whether ``spec`` leaves the choice to the embedded server: no URL given, and none
    in $DUETIME_REDIS_URL."""
    return (spec is None or spec == "") and not os.environ.get("DUETIME_REDIS_URL")


def embedded_url() -> str:
    """The embedded server's URL, without starting it (see ``start_embedded``)."""
    from duetime.embedded import server_url

    return server_url()


def start_embedded() -> None:
    """Start the embedded server, or attach to the running one: blocking (a process to
    start, about 75 ms), so an asyncio caller runs it in a thread."""
    from duetime.embedded import ensure_server

    ensure_server()


def connect(spec: RedisSpec, settings: Settings, asynchronous: bool) -> Connection:
    """The main and blocking clients for ``spec`` (a URL, a client, or None)."""
    if spec is None or isinstance(spec, str):
        url = resolve_url(spec)
        try:
            return _from_url(url, settings, asynchronous)
        except (ValueError, IndexError) as error:
            raise ConfigurationError(f"invalid Redis URL {mask_url(url)}: {error}") from None
    return _from_client(spec, settings, asynchronous)


def _timeouts(settings: Settings) -> tuple[float, float]:
    return settings.socket_timeout, settings.block_timeout + BLOCK_MARGIN


def _retry() -> Retry:
    # Short retries for a blip; daemons back off longer at their own loop level.
    return Retry(ExponentialBackoff(cap=0.5, base=0.05), 2)


def _overrides(settings: Settings, socket_timeout: float, tcp: bool) -> dict[str, Any]:
    return {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": settings.socket_timeout,
        # Keepalive notices a peer that vanished without a FIN (TCP only).
        **({"socket_keepalive": True} if tcp else {}),
        "health_check_interval": 30,
        "decode_responses": False,
        "encoding_errors": "surrogateescape",  # see operations._text
        "protocol": 2,
        "retry": _retry(),
    }


# --- URLs -----------------------------------------------------------------------------


def _from_url(url: str, settings: Settings, asynchronous: bool) -> Connection:
    scheme = url.partition("://")[0].lower()
    if scheme in ("redis+cluster", "rediss+cluster"):
        nodes, auth, _, _ = _multi_host(url)
        return _cluster(nodes, {**auth, "ssl": scheme.startswith("rediss")}, settings,
                        asynchronous, mask_url(url))  # fmt: skip
    if scheme in ("redis+sentinel", "rediss+sentinel"):
        nodes, auth, path, query = _multi_host(url)
        service, _, database = path.strip("/").partition("/")
        if not service:
            raise ValueError("name the service after the hosts: .../service_name[/db]")
        master = {**auth, "db": _database(database), "ssl": scheme.startswith("rediss")}
        sentinel_auth = (
            {"password": query["sentinel_password"]} if "sentinel_password" in query else {}
        )
        return _sentinel(nodes, sentinel_auth, service, master, settings, asynchronous,
                         mask_url(url))  # fmt: skip
    _database(urllib.parse.urlsplit(url).path.strip("/") if scheme in ("redis", "rediss") else "")
    module: Any = redis.asyncio if asynchronous else redis
    tcp = not url.startswith("unix:")
    main, blocking = (
        module.Redis(
            connection_pool=module.ConnectionPool.from_url(url, **_overrides(settings, t, tcp))
        )
        for t in _timeouts(settings)
    )
    return Connection(main, blocking, mask_url(url), clustered=False)


def _database(text: str) -> int:
    """redis-py takes a database that is not a number (``redis://host/x``) as 0 without
    a word; a typo must not silently point at another database."""
    if not text:
        return 0
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"the database after the last / must be a number, got {text!r}")
    return int(text)


def _multi_host(url: str) -> tuple[list[tuple[str, int]], dict[str, Any], str, dict[str, str]]:
    """Hosts, credentials, path and query of ``scheme://[user:pass@]h:p[,h:p...]/path``
    (urllib takes one host only)."""
    rest = url.partition("://")[2]
    rest, _, query = rest.partition("?")
    location, slash, path = rest.partition("/")
    userinfo, at, hosts = location.rpartition("@")
    auth: dict[str, Any] = {}
    if at:
        user, colon, password = userinfo.partition(":")
        if user:
            auth["username"] = urllib.parse.unquote(user)
        if colon:
            auth["password"] = urllib.parse.unquote(password)
    nodes = []
    for host in hosts.split(","):
        match = re.fullmatch(r"\[?([^\[\]]+?)\]?(?::(\d+))?", host.strip())
        if not match or not match.group(1):
            raise ValueError(f"expected host:port, got {host!r}")
        nodes.append((match.group(1), int(match.group(2) or 6379)))
    return nodes, auth, slash + path, dict(urllib.parse.parse_qsl(query))


# --- client objects ---------------------------------------------------------------------


def _from_client(client: Any, settings: Settings, asynchronous: bool) -> Connection:
    if isinstance(client, redis.cluster.RedisCluster | redis.asyncio.cluster.RedisCluster):
        nodes = [(node.host, int(node.port)) for node in _cluster_nodes(client)]
        kwargs = _cluster_kwargs(client)
        return _cluster(
            nodes, kwargs, settings, asynchronous, _describe_nodes("redis+cluster", nodes)
        )
    if not isinstance(client, redis.Redis | redis.asyncio.Redis):
        raise ConfigurationError(
            "redis= must be a URL, or a redis-py Redis, RedisCluster or Sentinel master_for() "
            f"client, got {type(client).__name__}"
        )
    pool = client.connection_pool
    if isinstance(
        pool, redis.sentinel.SentinelConnectionPool | redis.asyncio.sentinel.SentinelConnectionPool
    ):
        manager = pool.sentinel_manager
        nodes = [_host_port(sentinel) for sentinel in manager.sentinels]
        sentinel_auth = {
            name: value
            for name, value in manager.sentinels[0].connection_pool.connection_kwargs.items()
            if name in _AUTH_KWARGS
        }
        master = {
            name: value
            for name, value in pool.connection_kwargs.items()
            if name in _AUTH_KWARGS or name == "db" or name.startswith("ssl")
        }
        address = _describe_nodes("redis+sentinel", nodes) + f"/{pool.service_name}"
        return _sentinel(
            nodes, sentinel_auth, pool.service_name, master, settings, asynchronous, address
        )
    return _plain(client, settings, asynchronous)


def _plain(client: Any, settings: Settings, asynchronous: bool) -> Connection:
    module: Any = redis.asyncio if asynchronous else redis
    pool = client.connection_pool
    address = {
        name: value
        for name, value in pool.connection_kwargs.items()
        if name in _ADDRESS_KWARGS or name.startswith("ssl")
    }
    connection_class = pool.connection_class
    if asynchronous != isinstance(client, redis.asyncio.Redis):
        # The other kind of client: same address, this kind's connection class.
        connection_class = _connection_class(module, address)
    main, blocking = (
        module.Redis(
            connection_pool=module.ConnectionPool(
                connection_class=connection_class,
                **{**address, **_overrides(settings, t, tcp="path" not in address)},
            )
        )
        for t in _timeouts(settings)
    )
    return Connection(main, blocking, _describe(pool.connection_kwargs), clustered=False)


def _connection_class(module: Any, address: dict[str, Any]) -> Any:
    if "path" in address:
        return module.UnixDomainSocketConnection
    if any(name.startswith("ssl") for name in address):
        return module.SSLConnection
    return module.Connection


def _host_port(client: Any) -> tuple[str, int]:
    kwargs = client.connection_pool.connection_kwargs
    return str(kwargs.get("host", "localhost")), int(kwargs.get("port", 6379))


def _cluster_nodes(client: Any) -> list[Any]:
    """The nodes a RedisCluster client knows; an asyncio one that has not connected yet
    knows only its startup nodes."""
    return list(client.get_nodes()) or list(client.nodes_manager.startup_nodes.values())


def _cluster_kwargs(client: Any) -> dict[str, Any]:
    """Credentials and TLS of a RedisCluster client (redis-py keeps them per node)."""
    node = _cluster_nodes(client)[0]
    kwargs = getattr(node, "connection_kwargs", None)
    if kwargs is None:  # the synchronous client keeps them on the node's own client
        kwargs = node.redis_connection.connection_pool.connection_kwargs
    found = {name: value for name, value in kwargs.items() if name in _AUTH_KWARGS}
    found["ssl"] = (
        any(name.startswith("ssl") for name in kwargs)
        or "SSL" in type(kwargs.get("connection_class", object)).__name__
    )
    return found


def _describe(kwargs: dict[str, Any]) -> str:
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return f"redis://{host}:{port}/{kwargs.get('db', 0)}"


def _describe_nodes(scheme: str, nodes: list[tuple[str, int]]) -> str:
    return f"{scheme}://" + ",".join(f"{host}:{port}" for host, port in nodes)


# --- the two distributed kinds --------------------------------------------------------


def _cluster(
    nodes: list[tuple[str, int]],
    kwargs: dict[str, Any],
    settings: Settings,
    asynchronous: bool,
    address: str,
) -> Connection:
    module: Any = redis.asyncio.cluster if asynchronous else redis.cluster
    startup = [module.ClusterNode(host, port) for host, port in nodes]
    clients = []
    for timeout in _timeouts(settings):
        options = _overrides(settings, timeout, tcp=True)
        clients.append(module.RedisCluster(startup_nodes=startup, **options, **kwargs))
    return Connection(clients[0], clients[1], address, clustered=True)


def _sentinel(
    nodes: list[tuple[str, int]],
    sentinel_auth: dict[str, Any],
    service: str,
    master: dict[str, Any],
    settings: Settings,
    asynchronous: bool,
    address: str,
) -> Connection:
    client_class: Any = redis.asyncio.Redis if asynchronous else redis.Redis
    sentinel_kwargs = {**sentinel_auth, "socket_timeout": settings.socket_timeout,
                       "socket_connect_timeout": settings.socket_timeout}  # fmt: skip
    watcher = watcher_for(nodes, service, sentinel_kwargs, hold=settings.socket_timeout)
    manager_class, pool_class, connection_class = watched_classes(
        asynchronous, bool(master.get("ssl"))
    )
    sentinels = manager_class(nodes, sentinel_kwargs=sentinel_kwargs)
    sentinels.failover_watcher = watcher
    if not master.get("ssl"):
        master.pop("ssl", None)
    options = {"redis_class": client_class, "connection_pool_class": pool_class,
               "connection_class": connection_class,
               "failover_watcher": watcher, **master}  # fmt: skip
    main, blocking = (
        sentinels.master_for(service, **options, **_overrides(settings, t, tcp=True))
        for t in _timeouts(settings)
    )
    return Connection(main, blocking, address, clustered=False,
                      helpers=tuple(sentinels.sentinels), closing=(watcher.release,),
                      interrupted_at=lambda: watcher.interrupted_at)  # fmt: skip
