"""What the dashboard's routes read from a request: text fields of a form, a page number,
the dead-task filter, and a local path to go back to (never another site's)."""

from __future__ import annotations

import time
from typing import Any

from starlette.datastructures import FormData

from duetime.client import DeadFilter
from duetime.errors import InvalidInputError
from duetime.times import parse_moment

DEAD_FILTER_FIELDS = ("task", "error", "since", "until")


def local_path(candidate: str | None, default: str) -> str:
    """``candidate`` if it is a path on this site, else ``default`` (no open redirect)."""
    if (
        candidate
        and candidate.startswith("/")
        and not candidate.startswith("//")
        and "\\" not in candidate
        and not any(ord(c) < 32 for c in candidate)
    ):
        return candidate
    return default


def form_text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def page_number(text: str | None) -> int:
    try:
        return max(0, min(int(text or 0), 10_000))
    except ValueError:
        return 0


def dead_filter(params: Any) -> tuple[DeadFilter, dict[str, str], str | None]:
    """The dead-task filter of a query string or form (task, error, since, until), the
    fields as typed (to show them again), and what is wrong with them, if anything."""
    fields = {key: str(params.get(key) or "").strip() for key in DEAD_FILTER_FIELDS}
    now = time.time()
    try:
        since = parse_moment(fields["since"], now) if fields["since"] else None
        until = parse_moment(fields["until"], now) if fields["until"] else None
        chosen = DeadFilter(
            task=fields["task"] or None, error=fields["error"] or None, since=since, until=until
        )
    except InvalidInputError as error:
        return DeadFilter(), fields, str(error)
    return chosen, fields, None
