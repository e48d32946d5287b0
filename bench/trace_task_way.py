"""The files of duetime whose code runs for one task, from ``Queue.schedule_task`` to its
ack: the walk docs/design.md ("The life of a task") writes down, measured.

Run from the project root:

    .venv/bin/python bench/trace_task_way.py [--server redis|valkey] [--flow]

A private server on a free port; a dispatcher and a worker (one async no-op handler) run
on an event loop in a thread of this process. After one task has warmed every path up,
a profile hook notes each duetime file a function of which is entered: in the caller's
thread during one ``Queue.schedule_in(0.2, ...)`` call (the producer's way), then in the
daemons' thread from that call to the task's ack (the dispatcher's and the worker's). The
same hook runs as long again with nothing scheduled, so the files the idle loops enter
anyway (a heartbeat, a dispatcher's wake) are told apart. ``--flow`` puts the queue under
flow control (a concurrency limit per key that never binds), for the flow-controlled way.
Prints each list in the order the files were first entered.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from benchlib import Server

import duetime
from duetime.flow import KeyLimits, Limits
from duetime.states import TaskState

PACKAGE = Path(duetime.__file__).resolve().parent


class FileTrace:
    """The package's files whose functions are entered while ``recording`` is set, in the
    order first entered."""

    def __init__(self) -> None:
        self.recording = False
        self.files: list[str] = []

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.recording or event != "call":
            return
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(PACKAGE):
            name = path.relative_to(PACKAGE).as_posix()
            if name not in self.files:
                self.files.append(name)

    def take(self) -> list[str]:
        files, self.files = self.files, []
        return files


def run_daemons(url: str, queue: str, trace: FileTrace, stop: threading.Event) -> None:
    sys.setprofile(trace.hook)
    app = duetime.App()

    @app.task
    async def noop(data: Any) -> None:
        return None

    async def main() -> None:
        dispatcher = duetime.Dispatcher([queue], url)
        worker = duetime.Worker(app, queue, url, concurrency=10)
        running = [asyncio.ensure_future(dispatcher.run()), asyncio.ensure_future(worker.run())]
        while not stop.is_set():
            await asyncio.sleep(0.01)
        dispatcher.stop()
        worker.stop()
        await asyncio.gather(*running)

    asyncio.run(main())


def wait_for_success(queue: duetime.Queue, task_id: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = queue.status(task_id)
        if status is not None and status.state == TaskState.FINISHED:
            return
        time.sleep(0.005)
    raise SystemExit(f"task {task_id} did not succeed within 10 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("redis", "valkey"), default="redis")
    parser.add_argument("--flow", action="store_true", help="the queue under flow control")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        server = Server(args.server, Path(workdir))
        server.start()
        try:
            trace_way(server.url, args.flow)
        finally:
            server.stop()


def trace_way(url: str, flow: bool) -> None:
    queue_name = "trace-flow" if flow else "trace"
    queue = duetime.Queue(queue_name, url)
    options: dict[str, Any] = {"task": "noop", "result_ttl": 60}
    if flow:
        queue.set_limits(Limits(each_key=KeyLimits(concurrency=1000)))
        options["limit_key"] = "tenant-1"
    daemon_trace, caller_trace = FileTrace(), FileTrace()
    stop = threading.Event()
    daemons = threading.Thread(target=run_daemons, args=(url, queue_name, daemon_trace, stop))
    daemons.start()
    try:
        wait_for_success(queue, queue.schedule_in(0.2, {"warm": 1}, **options))
        sys.setprofile(caller_trace.hook)
        daemon_trace.recording = caller_trace.recording = True
        started = time.monotonic()
        task_id = queue.schedule_in(0.2, {"traced": 1}, **options)
        caller_trace.recording = False
        producer = caller_trace.take()
        wait_for_success(queue, task_id)
        daemon_trace.recording = False
        on_the_way = daemon_trace.take()
        sys.setprofile(None)
        daemon_trace.recording = True
        time.sleep(time.monotonic() - started)
        daemon_trace.recording = False
        idle = set(daemon_trace.take())
    finally:
        stop.set()
        daemons.join()
    show("the producer's way (Queue.schedule_in, the caller's thread)", producer, set())
    show("the dispatcher's and the worker's way, to the ack", on_the_way, idle)
    everything = list(dict.fromkeys(producer + on_the_way))
    only_the_task = [name for name in everything if name in producer or name not in idle]
    print(f"\nin all: {len(everything)} files; {len(only_the_task)} not entered when idle")


def show(title: str, files: list[str], idle: set[str]) -> None:
    print(f"\n{title}: {len(files)} files")
    for name in files:
        print(f"  {name}" + ("   (entered when idle too)" if name in idle else ""))


if __name__ == "__main__":
    main()
