"""How a command ends: the exit codes, and the one map from duetime errors to them, used
by every command (``guarded``) and by the daemon runner (``daemon_exit_code``)."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import click

from duetime.cli.output import fail
from duetime.errors import (
    ConfigurationError,
    DaemonFailedError,
    DuetimeError,
    InvalidInputError,
    RedisUnavailableError,
    TaskNotFoundError,
)
from duetime.store.redis.runner import mask_urls_in

EXIT_OK = 0
EXIT_VIOLATIONS = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_NOT_FOUND = 4
EXIT_ERROR = 5
EXIT_DAEMON_FAILED = 6
EXIT_DECLINED = 7
#: A bulk action (``bulk``, ``dead requeue``/``purge`` of named ids) changed nothing:
#: every task it was given or matched was skipped, or not touched, for the reasons said.
EXIT_NOTHING_DONE = 8

log = logging.getLogger("duetime")

#: The exit code of each kind of duetime error, the most specific first; any other
#: duetime error ends with EXIT_ERROR.
_EXIT_CODES: tuple[tuple[type[DuetimeError] | tuple[type[DuetimeError], ...], int], ...] = (
    (DaemonFailedError, EXIT_DAEMON_FAILED),
    (RedisUnavailableError, EXIT_UNAVAILABLE),
    (TaskNotFoundError, EXIT_NOT_FOUND),
    ((InvalidInputError, ConfigurationError), EXIT_USAGE),
)


def exit_code(error: DuetimeError) -> int:
    """The exit code a duetime error ends a command with."""
    for kinds, code in _EXIT_CODES:
        if isinstance(error, kinds):
            return code
    return EXIT_ERROR


def error_message(error: DuetimeError) -> str:
    """What to say of an error: the errors of a known kind are written without a password;
    any other may quote a Redis URL, whose password is masked."""
    if exit_code(error) == EXIT_ERROR:
        return mask_urls_in(str(error))
    return str(error)


def guarded(function: Callable[..., Any]) -> Callable[..., Any]:
    """Turn duetime errors into a message and a named exit code."""

    # wraps also keeps the click parameters already attached to ``function``.
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DuetimeError as error:
            fail(error_message(error), exit_code(error))

    return wrapper


def confirm_or_decline(question: str, nothing_done: str) -> None:
    """Ask ``question`` on stderr (the answer read from stdin, so ``yes |`` works); end
    with EXIT_DECLINED, saying ``nothing_done``, unless the answer is yes."""
    try:
        agreed = click.confirm(question, default=False, err=True)
    except click.Abort:  # no answer: end of input (not a terminal), or Ctrl-C
        agreed = False
    if not sys.stdin.isatty():
        click.echo(err=True)  # an answer read from a pipe is not echoed, nor its newline
    if not agreed:
        fail(f"not confirmed, {nothing_done}; pass --yes to skip the question", EXIT_DECLINED)


def daemon_exit_code(error: BaseException | None) -> int:
    """The exit code for how a daemon ended, with the reason logged."""
    if error is None:
        return EXIT_OK
    if not isinstance(error, DuetimeError):
        log.critical("a daemon failed", exc_info=error)
        return EXIT_DAEMON_FAILED
    code = exit_code(error)
    if code == EXIT_DAEMON_FAILED:
        log.critical("%s; exiting so that a supervisor can start a fresh process", error)
    else:
        log.critical("%s", error_message(error))
    return code
