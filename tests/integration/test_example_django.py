"""examples/django_app: its views in this process (Django's test client) schedule a
reminder, and its `manage.py runduetime` (a real process, Django set up) runs it; a
SIGTERM stops that process cleanly (exit 0, nothing left running or registered)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest
from django.test import Client, override_settings

from duetime import Queue
from tests.helpers import wait_until_sync

SITE = Path(__file__).resolve().parents[2] / "examples" / "django_app"


@pytest.fixture
def site(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    """The site, set up in this process (once: Django's settings are the process's), its
    duetime Queue on the test's server."""
    monkeypatch.syspath_prepend(str(SITE))
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "reminders_site.settings")
    django.setup()
    queue: Any = importlib.import_module("reminders.queue")
    with override_settings(DUETIME_REDIS_URL=redis_url):
        queue.reminders_queue.cache_clear()
        try:
            yield Client()
        finally:
            queue.reminders_queue().close()
            queue.reminders_queue.cache_clear()


def test_a_reminder_scheduled_through_the_site_runs_in_runduetime(
    site: Client, redis_url: str
) -> None:
    environment = {**os.environ, "DUETIME_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-W", "always::ResourceWarning", "manage.py", "runduetime"]
    daemons = subprocess.Popen(
        command, cwd=SITE, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        with Queue("reminders", redis_url) as queue:

            def registered() -> bool:
                return len(queue.stats().workers) == 1 or daemons.poll() is not None

            wait_until_sync(registered, timeout=60, what="runduetime's worker")
            assert daemons.poll() is None, daemons.communicate()

            body = json.dumps({"to": "ada@example.com", "in_seconds": 0.2})
            created = site.post("/reminders", body, content_type="application/json")
            assert created.status_code == 201, created.content
            path = f"/reminders/{created.json()['id']}"

            def finished() -> bool:
                return bool(site.get(path).json()["state"] == "finished")

            wait_until_sync(finished, what="runduetime to run the reminder")
            assert site.get(path).json()["result"] == {
                "sent_to": "ada@example.com",
                "sent_from": "reminders@example.com",  # the site's settings, in the handler
            }
            # Refusals, each with what to fix.
            assert "task id" in site.get("/reminders/not an id").json()["error"]
            late = json.dumps({"to": "x", "in_seconds": -1})
            refused = site.post("/reminders", late, content_type="application/json")
            assert refused.status_code == 400 and "delay must be" in refused.json()["error"]
            assert site.get("/reminders/unknown").status_code == 404

            daemons.send_signal(signal.SIGTERM)
            out, err = daemons.communicate(timeout=60)
            assert daemons.returncode == 0, err
            assert out.splitlines()[-1] == "duetime stopped"
            for trouble in ("Traceback", "ResourceWarning", "Task was destroyed"):
                assert trouble not in err, err
            stats = queue.stats()
            assert (stats.workers, stats.running, stats.ready) == ({}, 0, 0)
            assert stats.counters.get("completed") == 1
            assert queue.check() == []
    finally:
        if daemons.poll() is None:
            daemons.kill()
            daemons.communicate()
