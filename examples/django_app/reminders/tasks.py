"""The site's duetime handlers. They run in `manage.py runduetime`, after Django is set
up, so they may use settings, models and anything else of the project."""

from typing import Any

from django.conf import settings

import duetime

app = duetime.App()


@app.task
def send_reminder(data: dict[str, Any]) -> dict[str, Any]:
    # A plain function: the worker runs it on a thread of its own, as Django code expects.
    # A real site would call django.core.mail.send_mail here.
    return {"sent_to": data["to"], "sent_from": settings.DEFAULT_FROM_EMAIL}
