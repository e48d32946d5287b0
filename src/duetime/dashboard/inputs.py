"""What the dashboard's routes read from a request: text fields of a form, a page number,
the dead-task filter, a local path to go back to (never another site's), and the limits
of the flow control forms (checked by ``duetime.flow``, never here)."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException

from duetime import flow
from duetime.client import DeadFilter
from duetime.errors import InvalidInputError, InvalidOptionError
from duetime.flow import KeyLimits, Limits, Rate
from duetime.times import parse_moment
from duetime.validation import shown

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


#: The last page number a listing serves (pages count from 0).
LAST_PAGE = 10_000


def page_number(text: str | None) -> int:
    """The ``page`` of a query string (0 when absent); a 400 that says what to give for
    anything else (a negative page, a word), never a page silently served instead."""
    if text is None or text == "":
        return 0
    if not _WHOLE.fullmatch(text) or not 0 <= int(text) <= LAST_PAGE:
        raise HTTPException(
            400, f"page must be a whole number from 0 to {LAST_PAGE:,}, got {shown(text, 40)}"
        )
    return int(text)


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


# --- limits ------------------------------------------------------------------------------

_WHOLE = re.compile(r"[+-]?[0-9]+")


def whole_number(form: FormData, name: str, what: str) -> int | None:
    """The whole number typed in field ``name``, or None when it is empty (no limit).
    Only its form is checked here; its range is ``duetime.flow``'s to check."""
    text = form_text(form, name)
    if not text:
        return None
    if not _WHOLE.fullmatch(text):
        raise InvalidOptionError(
            f"{what} must be a whole number, or empty for no limit; got {shown(text, 40)}"
        )
    try:
        return int(text)
    except ValueError:  # longer than Python turns into an integer
        raise InvalidOptionError(f"{what} is far too large: {shown(text, 40)}") from None


def rate_field(form: FormData, prefix: str, what: str) -> Rate | None:
    """The rate of fields ``<prefix>rate`` ("10/s") and ``<prefix>burst`` (empty: 1),
    read with ``Rate.parse``; None when both are empty."""
    text = form_text(form, f"{prefix}rate")
    burst = whole_number(form, f"{prefix}burst", f"{what} burst")
    if not text:
        if burst is not None:
            raise InvalidOptionError(f"{what}: a burst needs a rate (such as 10/s)")
        return None
    return Rate.parse(text, 1 if burst is None else burst)


def queue_limits(form: FormData, keys: Mapping[str, KeyLimits]) -> Limits:
    """The queue-wide limits of the queue form (cap, rate, each key's), with the named
    keys' own limits ``keys`` kept; checked by ``Limits``."""
    each = KeyLimits(
        whole_number(form, "each_concurrency", "each key's concurrency"),
        rate_field(form, "each_", "each key's rate"),
    )
    return Limits(whole_number(form, "cap", "cap"), rate_field(form, "", "rate"), each, keys)


def limit_key_field(form: FormData) -> str:
    """The limit key of the key form, exactly as typed (a key may hold spaces), checked
    by ``duetime.flow``."""
    value = form.get("key")
    return flow.limit_key(value if isinstance(value, str) else "")


def key_limits(form: FormData) -> tuple[str, KeyLimits]:
    """The limit key of the key form and its own limits, checked by ``duetime.flow``."""
    key = limit_key_field(form)
    concurrency = whole_number(form, "concurrency", "concurrency")
    return key, KeyLimits(concurrency, rate_field(form, "", "rate"))
