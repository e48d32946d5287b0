"""`python manage.py runduetime`: the site's duetime dispatcher and worker, in one
process with Django set up, until Ctrl-C or SIGTERM (a second one stops at once)."""

import asyncio
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

import duetime
from reminders.tasks import app


class Command(BaseCommand):
    help = "Run the site's duetime dispatcher and worker until Ctrl-C or SIGTERM."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--concurrency", type=int, default=10)

    def handle(self, *args: Any, concurrency: int, **options: Any) -> None:
        asyncio.run(self.serve(concurrency))
        self.stdout.write("duetime stopped")

    async def serve(self, concurrency: int) -> None:
        queue, url = settings.DUETIME_QUEUE, settings.DUETIME_REDIS_URL
        daemons: list[duetime.Dispatcher | duetime.Worker] = [
            duetime.Dispatcher(queue, url),
            duetime.Worker(app, queue, url, concurrency=concurrency),
        ]

        def stop() -> None:
            # Graceful: running tasks end, the worker's others go back to the queue.
            # Called again (a second signal), the worker stops at once.
            for daemon in daemons:
                daemon.stop()

        loop = asyncio.get_running_loop()
        for number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(number, stop)
        runs = [asyncio.create_task(daemon.run()) for daemon in daemons]
        self.stdout.write(f"duetime: dispatcher and worker on queue {queue!r}")
        done, _ = await asyncio.wait(runs, return_when=asyncio.FIRST_EXCEPTION)
        if any(run.exception() is not None for run in done):
            stop()  # one gave up: stop the other too, and exit non-zero below
        await asyncio.wait(runs)
        for daemon, run in zip(daemons, runs, strict=True):
            if (error := run.exception()) is not None:
                raise CommandError(f"duetime {type(daemon).__name__} gave up: {error}")
