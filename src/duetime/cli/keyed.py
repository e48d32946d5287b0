"""The options of ``duetime schedule`` that give a call a debounce, throttle or unique
key, read into a ``Debounce``, ``Throttle`` or ``Unique`` (an option that belongs to
another mode is a usage error), and the remark that says what the call did."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from duetime.cli.output import shown_time
from duetime.cli.values import DURATION
from duetime.client import Queue
from duetime.keyed import (
    COLLECT_MODES,
    MOST_COLLECTED,
    UNTIL_MODES,
    Debounce,
    KeyedMode,
    Scheduled,
    Throttle,
    Unique,
)
from duetime.states import KeyedOutcome

F = TypeVar("F", bound=Callable[..., Any])

#: Each option of a mode, by the mode it belongs to ("window" to two).
_BELONGS = {
    "window": ("debounce", "throttle"),
    "max_wait": ("debounce",),
    "collect": ("debounce",),
    "most": ("debounce",),
    "trailing": ("throttle",),
    "until": ("unique",),
}


def keyed_options(command: F) -> F:
    """The keyed options of ``duetime schedule``."""
    options = [
        click.option("--debounce", metavar="KEY", help="Collapse the calls of KEY into one task."),
        click.option("--throttle", metavar="KEY", help="Run the first call of KEY per window."),
        click.option("--unique", metavar="KEY", help="At most one live task of KEY."),
        click.option("--window", type=DURATION, metavar="DURATION", help="The window."),
        click.option(
            "--max-wait",
            type=DURATION,
            metavar="DURATION",
            help="Debounce: run by then at the latest (from the first call).",
        ),
        click.option(
            "--collect",
            type=click.Choice(COLLECT_MODES),
            help="Debounce: the task gets the last call's data (default), or all of them.",
        ),
        click.option(
            "--most",
            type=click.IntRange(1, MOST_COLLECTED),
            help="Debounce --collect all: most calls one task holds (default 100).",
        ),
        click.option(
            "--trailing",
            is_flag=True,
            default=None,
            help="Throttle: fold the calls of a window into one run at its end.",
        ),
        click.option(
            "--until",
            type=click.Choice(UNTIL_MODES),
            help="Unique: while the task has not started (default), or not finished.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def keyed_mode(options: dict[str, Any]) -> KeyedMode | None:
    """The mode the keyed options of a call ask for, taken out of ``options``."""
    given = {name: options.pop(name) for name in ("debounce", "throttle", "unique")}
    extra = {name: options.pop(name) for name in _BELONGS}
    chosen = [name for name, key in given.items() if key is not None]
    if len(chosen) > 1:
        raise click.UsageError(
            "give at most one of --debounce, --throttle and --unique, not "
            + " and ".join(f"--{name}" for name in chosen)
        )
    for name, value in extra.items():
        if value is not None and (not chosen or chosen[0] not in _BELONGS[name]):
            owners = " or ".join(f"--{mode}" for mode in _BELONGS[name])
            raise click.UsageError(f"--{name.replace('_', '-')} goes with {owners}")
    if not chosen:
        return None
    mode, key = chosen[0], given[chosen[0]]
    if mode == "unique":
        return Unique(key, until=extra["until"] or "started")
    if extra["window"] is None:
        raise click.UsageError(f"--{mode} needs --window")
    if mode == "throttle":
        return Throttle(key, extra["window"], trailing=bool(extra["trailing"]))
    return Debounce(
        key,
        extra["window"],
        max_wait=extra["max_wait"],
        collect=extra["collect"] or "last",
        most=extra["most"] or 100,
    )


def keyed_option(mode: KeyedMode) -> dict[str, Any]:
    """The schedule option that carries ``mode``."""
    name = "debounce" if isinstance(mode, Debounce) else "throttle"
    return {"unique" if isinstance(mode, Unique) else name: mode}


def keyed_remark(done: Scheduled) -> str:
    """What a keyed call did, in a line."""
    runs = f"runs at {shown_time(done.run_at)}" if done.run_at is not None else ""
    if done.outcome == KeyedOutcome.CREATED:
        return f"created: {runs}"
    if done.outcome == KeyedOutcome.COLLAPSED:
        return f"collapsed into the waiting task ({done.calls} calls): {runs}"
    if done.outcome == KeyedOutcome.DROPPED:
        return (
            f"dropped: throttled until {shown_time(done.until)} (call {done.calls} of the window)"
        )
    return f"existing: the key's task is {done.state}"


def schedule_keyed_call(
    client: Queue,
    mode: KeyedMode,
    at: float | None,
    delay: float | None,
    payload: Any,
    options: dict[str, Any],
) -> None:
    """Schedule with ``mode``; print the id of the task that carries the call, and on
    stderr what the call did."""
    when: dict[str, Any] = {"at": at} if at is not None else {"delay": delay}
    done = client.schedule_keyed(payload, **when, **options, **keyed_option(mode))
    click.echo(done.id)
    click.echo(keyed_remark(done), err=True)
