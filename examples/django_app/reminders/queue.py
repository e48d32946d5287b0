"""The site's one duetime Queue, made on first use and shared by every request of the
process (a Queue is safe to use from several threads, and keeps its connections)."""

import functools

from django.conf import settings

import duetime


@functools.cache
def reminders_queue() -> duetime.Queue:
    return duetime.Queue(settings.DUETIME_QUEUE, settings.DUETIME_REDIS_URL)
