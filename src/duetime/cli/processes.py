"""How a daemon process lives: its daemons run until a signal stops them, and it ends with
the exit code of how they ended; or it forks worker processes and restarts those that
crash."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from duetime.cli.exits import daemon_exit_code

log = logging.getLogger("duetime")


class Daemon(Protocol):
    """What the runner needs of a daemon (a Dispatcher, a Worker)."""

    async def run(self) -> None:
        """Work until stopped; raise when it gave up (DaemonFailedError) or broke."""

    def stop(self) -> None:
        """Stop gracefully; called again, stop at once (a dispatcher, which holds no task,
        stops at once anyway)."""


#: Signals that came after a daemon process started and before ``run_daemons`` or
#: ``fork_workers`` took the signals over: they act on them first.
_early_signals: list[int] = []


@contextlib.contextmanager
def stopped_cleanly_while_starting() -> Iterator[None]:
    """While a daemon process loads its app and checks its queues it holds no task: a
    SIGTERM or SIGINT then ends it at once with code 0 (a supervisor stopping it sees a
    clean stop, not a death by signal). After the block a signal is kept for
    ``run_daemons`` or ``fork_workers``, which stop at once when one came; when the block
    fails, the handlers before are put back."""

    def leave(signum: int, frame: Any) -> None:
        log.info("stopped before starting")
        raise SystemExit(0)

    def keep(signum: int, frame: Any) -> None:
        _early_signals.append(signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (a command run from a test thread)
        return
    before = {signum: signal.signal(signum, leave) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except BaseException:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        raise
    for signum in before:
        signal.signal(signum, keep)


def run_daemons(daemons: Sequence[Daemon]) -> None:
    """Run daemons until SIGTERM/SIGINT: the first signal stops them gracefully, the
    second at once. When one of them fails (DaemonFailedError, or any exception), the
    others are stopped gracefully and the process exits non-zero, so that whatever
    supervises it starts a fresh one: never a process that is up but not working."""

    async def supervise() -> int:
        loop = asyncio.get_running_loop()
        signals = {"count": 0}

        def stop() -> None:
            # Every signal stops every daemon again: a second stop() means at once.
            for daemon in daemons:
                daemon.stop()

        def on_signal() -> None:
            signals["count"] += 1
            now = signals["count"] > 1
            log.info("stopping %s", "now" if now else "gracefully (signal again to stop at once)")
            stop()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal)
        runs = [asyncio.create_task(daemon.run()) for daemon in daemons]
        while _early_signals:
            _early_signals.pop()
            on_signal()
        done, _ = await asyncio.wait(runs, return_when=asyncio.FIRST_EXCEPTION)
        if any(task.exception() is not None for task in done):
            stop()
        await asyncio.wait(runs)
        return max(daemon_exit_code(task.exception()) for task in runs)

    code = asyncio.run(supervise())
    # A handler thread that overran its timeout cannot be stopped, and the interpreter
    # joins such threads at exit; its task is already handed back, so leave now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fork_workers(processes: int, child_main: Callable[[int], None]) -> None:
    """Fork worker processes, forward signals to them and restart any that crash;
    ``child_main`` gets the child's slot, 0 to ``processes`` - 1 (kept across restarts)."""
    children: dict[int, int] = {}
    stopping = {"count": 0}

    def spawn(slot: int) -> None:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            # Ctrl-C reaches the whole process group; the parent forwards it as
            # SIGTERM, so a child acting on both would count two signals and stop hard.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            status = 1
            try:
                child_main(slot)
                status = 0
            except BaseException:
                log.exception("worker process failed")
            finally:
                os._exit(status)
        children[pid] = slot

    def forward(signum: int, frame: Any) -> None:
        stopping["count"] += 1
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    if _early_signals:  # stopped while it started: no worker process to start
        _early_signals.clear()
        return
    for slot in range(processes):
        spawn(slot)
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        slot = children.pop(pid, -1)
        if slot >= 0 and not stopping["count"]:
            log.warning("worker process %d exited (status %d); starting another", pid, status)
            time.sleep(0.5)
            spawn(slot)
