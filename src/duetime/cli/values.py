"""Reading the values typed on the command line: times, durations and JSON documents;
what they refuse is a usage error (exit 2) whose message says what to write."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from duetime import times
from duetime.errors import InvalidInputError

if TYPE_CHECKING:
    _FloatParam = click.ParamType[float]
else:  # click before 8.4 has no generic ParamType
    _FloatParam = click.ParamType


class Parsed(_FloatParam):
    """An option value read by one of the ``duetime.times`` parsers; what they refuse
    is a usage error (exit 2) whose message says what to write."""

    def __init__(self, name: str, parse: Callable[[str], float]) -> None:
        self.name = name
        self.parse = parse

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):  # a default, already read
            return value
        try:
            return self.parse(str(value))
        except InvalidInputError as error:
            self.fail(str(error), param, ctx)


DURATION = Parsed("duration", times.parse_duration)
TIME = Parsed("time", times.parse_time)
# "2h" is two hours before the moment the option is read.
MOMENT = Parsed("time", lambda text: times.parse_moment(text, time.time()))


def json_argument(data: str) -> Any:
    """The JSON document DATA, or a usage error that says what is wrong with it."""
    try:
        return json.loads(data, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, RecursionError) as error:
        raise click.BadParameter(f"not valid JSON: {error}", param_hint="DATA") from None
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="DATA") from None


def _refuse_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity, which are not JSON and not portable data.
    raise ValueError(f"not valid JSON: {name} is not a JSON value")
