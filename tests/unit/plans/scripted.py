"""A scripted runner for plans: drives a plan without a server, checking each request it
yields against the one the test expects and sending back the reply the test wrote for
it. A request that differs, a request past the end of the script, or a step of the
script left over when the plan returns fails the test, naming the step.

A step is ``(expected, reply)``: ``expected`` is a request, compared as what a runner
would send (a sequence of keys or arguments as a list, a script by its name), or a
function given the request, which asserts what the test cares about in it (for a packed
argument, say). ``reply`` is sent back as the runner would: a value, or the exception
a plan asked to see as its reply; or an ``Answer``, which makes the reply from the
request (a fake server answering a batch of reads by what each reads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from duetime.store.plans.requests import Batch, Command, Durably, Eval, EvalMany, Plan, Request

T = TypeVar("T")

#: The server time the tests' manual clock reads (ms; see conftest.py).
NOW_MS = 1_800_000_000_000

Expected = Request | Callable[[Request], None]
Step = tuple[Expected, Any]


@dataclass(frozen=True, slots=True)
class Answer:
    """A reply made from the request it answers."""

    make: Callable[[Request], Any]


def run_plan(plan: Plan[T], *steps: Step) -> T:
    """Run ``plan`` through ``steps``; its return value."""
    reply: Any = None
    for number, (expected, scripted) in enumerate(steps, start=1):
        try:
            request = plan.send(reply)
        except StopIteration:
            left = [shown(step) for step, _ in steps[number - 1 :]]
            pytest.fail(f"the plan returned before step {number}; expected still: {left}")
        check(number, expected, request)
        reply = scripted.make(request) if isinstance(scripted, Answer) else scripted
    try:
        request = plan.send(reply)
    except StopIteration as done:
        value: T = done.value
        return value
    pytest.fail(f"unexpected request after the last step ({len(steps)}): {shown(request)}")


def check(number: int, expected: Expected, request: Request) -> None:
    if isinstance(expected, Command | Eval | EvalMany | Durably | Batch):
        assert wire(request) == wire(expected), (
            f"step {number}: the plan asked\n  {shown(request)}\nnot\n  {shown(expected)}"
        )
    else:
        expected(request)


def wire(request: Request) -> tuple[Any, ...]:
    """A request as a runner sends it: comparable whatever sequence types built it."""
    if isinstance(request, Command):
        return ("command", tuple(request.args), request.block, request.route,
                request.refusal_as_reply, request.failure_as_reply)  # fmt: skip
    if isinstance(request, Eval):
        return ("eval", request.script.name, list(request.keys), list(request.args))
    if isinstance(request, EvalMany):
        return ("evalmany", request.script.name, calls(request.calls))
    if isinstance(request, Durably):
        return ("durably", wire(request.calls), request.durability)
    return ("batch", [wire(command) for command in request.commands], request.transaction,
            request.read_only)  # fmt: skip


def calls(made: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[tuple[list[str], list[Any]]]:
    return [(list(keys), list(args)) for keys, args in made]


def shown(expected: Expected) -> str:
    if isinstance(expected, Command | Eval | EvalMany | Durably | Batch):
        return repr(wire(expected))
    return f"a request that passes {getattr(expected, '__name__', expected)}"
