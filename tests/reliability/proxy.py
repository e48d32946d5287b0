"""A small fault-injecting TCP proxy for loopback tests (no external tools).

It sits between daemons and a Redis server and forwards bytes both ways. On command it
- **stalls**: stops forwarding on every connection, current and new, without closing
  anything, like a network that silently drops packets; ``heal`` resumes forwarding
  and delivers what was held back (a late packet reaches the server late);
- **cuts**: resets every current connection (RST), like a middlebox dropping state;
- **freezes** the current connections for good while new ones flow, so each client
  holds a dead socket that neither answers nor closes (a peer that vanished).

The proxy runs its own asyncio loop in a daemon thread; the control methods are
called from the test's thread and return once the change is in effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

CHUNK = 65536


@dataclass(eq=False)
class _Pair:
    """One proxied connection: the client's side and the server's side."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    frozen: bool = False
    pumps: list[asyncio.Task[None]] = field(default_factory=list)


class FaultyProxy:
    """Forwards 127.0.0.1:<port> to 127.0.0.1:<upstream_port>, with injectable faults."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._pairs: set[_Pair] = set()

    # --- control (called from the test's thread) -------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._call(self._listen)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stall(self) -> None:
        """Stop forwarding everywhere; connections stay open and new ones are accepted."""
        self._call_sync(lambda: self._event().clear())

    def heal(self) -> None:
        """Forward again, held-back data first. Frozen connections stay frozen."""
        self._call_sync(lambda: self._event().set())

    def cut(self) -> int:
        """Reset every current connection; returns how many were cut."""
        return self._call_sync(self._cut_all)

    def freeze_existing(self) -> int:
        """Freeze every current connection for good; new connections flow normally."""

        def freeze() -> int:
            for pair in self._pairs:
                pair.frozen = True
            return len(self._pairs)

        return self._call_sync(freeze)

    def open_connections(self) -> int:
        return self._call_sync(lambda: len(self._pairs))

    def close(self) -> None:
        """Reset everything and stop the proxy's thread (safe to call twice)."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    # --- the loop's side -------------------------------------------------------------

    def _event(self) -> asyncio.Event:
        assert self._flowing is not None
        return self._flowing

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        pair = _Pair(writer)
        self._pairs.add(pair)
        try:
            # A stalled network does not complete a connection's first exchange either:
            # connect upstream only once data may flow.
            await self._event().wait()
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    "127.0.0.1", self.upstream_port
                )
            except OSError:
                _reset(writer)
                return
            pair.upstream = up_writer
            pair.pumps = [
                asyncio.create_task(self._pump(pair, reader, up_writer)),
                asyncio.create_task(self._pump(pair, up_reader, writer)),
            ]
            await asyncio.wait(pair.pumps, return_when=asyncio.FIRST_COMPLETED)
            # One side closed: pass the close on to the other side, as TCP would.
            for pump in pair.pumps:
                pump.cancel()
            _close(writer)
            _close(up_writer)
        finally:
            self._pairs.discard(pair)

    async def _pump(
        self, pair: _Pair, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            try:
                data = await reader.read(CHUNK)
            except OSError:
                return
            # Held data is delivered after heal even if the sender has given up on it
            # meanwhile: that is what a late packet does, and fencing must cope with it.
            await self._event().wait()
            while pair.frozen:
                await asyncio.sleep(3600)
            if not data:
                return
            writer.write(data)
            try:
                await writer.drain()
            except OSError:
                return

    def _cut_all(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            _reset(pair.client)
            if pair.upstream is not None:
                _reset(pair.upstream)
            for pump in pair.pumps:
                pump.cancel()
        return len(pairs)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        self._cut_all()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- plumbing --------------------------------------------------------------------

    def _call(self, coroutine: Callable[[], Coroutine[Any, Any, None]]) -> None:
        asyncio.run_coroutine_threadsafe(coroutine(), self._loop).result(10)

    def _call_sync(self, function: Callable[[], T]) -> T:
        async def wrapped() -> T:
            return function()

        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result(10)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST instead of FIN: SO_LINGER with a zero timeout, then abort."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()
