"""Starting, watching and killing one system's processes, from the runner's side.

Every process runs ``child.py`` in the system's own venv (``PATH`` starts with its bin/,
``PYTHONPATH`` holds bench/), in a session of its own, so a kill -9 of its process group
also reaches the children it forked (a celery pool, a dramatiq worker, RQ's scheduler).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import Server

from peers.common import JobSpec, count_stamps
from peers.venvs import PEERS, Venv

BENCH = PEERS.parent
CHILD = PEERS / "child.py"


@dataclass(slots=True)
class System:
    name: str
    venv: Venv
    info: dict[str, Any] = field(default_factory=dict)  # child.py describe
    error: str = ""  # why it cannot run here ("" when it can)

    @property
    def bulk(self) -> str:
        return str(self.info.get("bulk", ""))

    def fill_mode(self) -> str:
        return "bulk" if self.bulk else "fill"


@dataclass(slots=True)
class Proc:
    system: str
    role: str
    number: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (the role and anything it forked)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def log_tail(self, lines: int = 15) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def rss_bytes(self) -> int:
        """Resident memory of every process in this role's process group."""
        total = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError):
                if os.getpgid(int(entry.name)) != self.process.pid:
                    continue
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total


class ChildError(RuntimeError):
    pass


class Harness:
    """The server, a scratch directory, and every process started for one session."""

    def __init__(self, server: Server, workdir: Path, processes: int) -> None:
        self.server = server
        self.workdir = workdir
        self.processes = processes  # worker processes per system
        self.started: list[Proc] = []
        self._serial = 0

    def env(
        self, system: System, stamp_file: Path | None = None, end_file: Path | None = None
    ) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("VIRTUAL_ENV", "PYTHONHOME"):
            env.pop(name, None)
        env["PATH"] = f"{system.venv.bin}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = str(BENCH)
        env["BENCH_REDIS_URL"] = self.server.url
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if stamp_file is not None:
            env["BENCH_STAMP_FILE"] = str(stamp_file)
        if end_file is not None:
            env["BENCH_END_FILE"] = str(end_file)
        return env

    def stamp_file(self, label: str) -> Path:
        self._serial += 1
        path = self.workdir / f"{self._serial:04d}-{label}.stamps"
        path.unlink(missing_ok=True)
        return path

    # --- one-shot children -----------------------------------------------------------

    def describe(self, system: System) -> dict[str, Any]:
        done = subprocess.run(
            [str(system.venv.python), str(CHILD), "describe", "--system", system.name],
            env=self.env(system), capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise ChildError(done.stderr.strip().splitlines()[-1] if done.stderr else "failed")
        info: dict[str, Any] = json.loads(done.stdout)
        return info

    def produce_start(
        self, system: System, spec: JobSpec, mode: str, stamp_file: Path | None = None
    ) -> subprocess.Popen[str]:
        from peers.child import spec_json

        return subprocess.Popen(
            [str(system.venv.python), str(CHILD), "produce", "--system", system.name,
             "--url", self.server.url, "--spec", spec_json(spec), "--mode", mode],
            env=self.env(system, stamp_file), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip

    def produce_wait(self, process: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise ChildError(f"producer still running after {timeout:g} s; killed") from None
        if process.returncode != 0:
            lines = err.strip().splitlines()
            raise ChildError("producer failed: " + (lines[-1] if lines else "no output"))
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result

    def produce(
        self,
        system: System,
        spec: JobSpec,
        mode: str,
        stamp_file: Path | None = None,
        timeout: float = 1800.0,
    ) -> dict[str, Any]:
        return self.produce_wait(self.produce_start(system, spec, mode, stamp_file), timeout)

    # --- long-running roles ----------------------------------------------------------

    def start(
        self,
        system: System,
        profile: str,
        stamp_file: Path,
        workers: int | None = None,
        end_file: Path | None = None,
    ) -> list[Proc]:
        """Start the system's roles for ``profile``: each non-worker role once, then
        ``workers`` (default: the session's process count) worker processes. With
        ``end_file``, handlers stamp their end there too."""
        roles: list[str] = system.info["roles"][profile]
        count = self.processes if workers is None else workers
        plan = [(r, 1) for r in roles if r != "worker"]
        plan += [("worker", n) for n in range(1, count + 1)] if "worker" in roles else []
        procs = []
        for role, number in plan:
            self._serial += 1
            log = self.workdir / f"{self._serial:04d}-{system.name}-{role}{number}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [str(system.venv.python), str(CHILD), "role", "--system", system.name,
                     "--url", self.server.url, "--role", role, "--profile", profile,
                     "--number", str(number)],
                    env=self.env(system, stamp_file, end_file), stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            proc = Proc(system.name, role, number, process, log)
            procs.append(proc)
            self.started.append(proc)
        return procs

    def stop(self, procs: list[Proc]) -> None:
        for proc in procs:
            proc.kill()

    def kill_all(self) -> None:
        for proc in self.started:
            proc.kill()

    def wait_stamps(
        self,
        stamp_file: Path,
        target: int,
        deadline: float,
        procs: Sequence[Proc] = (),
        rss_cap: int = 0,
    ) -> str:
        """Poll the stamp file every 2 ms until it holds ``target`` records or the
        (wall-clock) ``deadline`` passes. Returns "" or why it gave up early."""
        last_check = 0.0
        while time.time() < deadline:
            if count_stamps(stamp_file) >= target:
                return ""
            now = time.monotonic()
            if now - last_check > 1.0:
                last_check = now
                dead = [p for p in procs if not p.alive()]
                if dead:
                    return f"{dead[0].role} exited ({dead[0].process.returncode}): " + (
                        dead[0].log_tail(3).replace("\n", " | ")
                    )
                if rss_cap:
                    rss = sum(p.rss_bytes() for p in procs)
                    if rss > rss_cap:
                        return f"worker memory passed {rss_cap / 2**30:.0f} GiB; stopped"
            time.sleep(0.002)
        return "timed out"


def warn(message: str) -> None:
    print(f"  warning: {message}", file=sys.stderr, flush=True)
