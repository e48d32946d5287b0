"""The scripted runner itself (scripted.py): it fails on a request the script does not
expect, on one past its end, and on a step left over."""

from __future__ import annotations

import pytest

from duetime.store.plans.requests import Command, Plan
from tests.unit.plans.scripted import run_plan


def two_gets() -> Plan[list[object]]:
    first = yield Command(("GET", "a"))
    second = yield Command(("GET", "b"))
    return [first, second]


def test_the_replies_go_back_in_order_and_the_value_comes_out() -> None:
    steps = [(Command(("GET", "a")), 1), (Command(("GET", "b")), 2)]
    assert run_plan(two_gets(), *steps) == [1, 2]


def test_a_request_other_than_expected_fails_naming_the_step() -> None:
    with pytest.raises(AssertionError, match="step 2"):
        run_plan(two_gets(), (Command(("GET", "a")), 1), (Command(("GET", "c")), 2))


def test_a_request_past_the_script_fails() -> None:
    with pytest.raises(pytest.fail.Exception, match="unexpected request"):
        run_plan(two_gets(), (Command(("GET", "a")), 1))


def test_a_step_left_over_fails() -> None:
    steps = [(Command(("GET", "a")), 1), (Command(("GET", "b")), 2), (Command(("GET", "c")), 3)]
    with pytest.raises(pytest.fail.Exception, match="before step 3"):
        run_plan(two_gets(), *steps)


def test_a_check_function_sees_the_request() -> None:
    seen: list[Command] = []

    def is_a_get(request: object) -> None:
        assert isinstance(request, Command) and request.args[0] == "GET"
        seen.append(request)

    assert run_plan(two_gets(), (is_a_get, 1), (is_a_get, 2)) == [1, 2]
    assert len(seen) == 2
