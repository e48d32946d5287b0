"""``duetime limits`` and the flow options of ``duetime schedule``, on a real server."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from duetime import KeyLimits, Limits, Queue, Rate
from duetime.cli import EXIT_NOT_FOUND, EXIT_USAGE, main


def run(redis_url: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [*args, "--redis", redis_url])
    return result.exit_code, result.stdout, result.stderr


def test_limits_set_key_show_and_clear(redis_url: str, queue_name: str) -> None:
    code, out, _ = run(redis_url, "limits", "set", "--create", "-q", queue_name, "--cap", "5",
                       "--each-concurrency", "2", "--each-rate", "10/s")  # fmt: skip
    assert code == 0, out
    assert (
        run(redis_url, "limits", "key", "--create", "-q", queue_name, "vip", "--concurrency", "4")[
            0
        ]
        == 0
    )
    with Queue(queue_name, redis_url) as queue:
        assert queue.limits() == Limits(
            cap=5,
            each_key=KeyLimits(2, Rate(10)),
            keys={"vip": KeyLimits(concurrency=4)},
        )
        queue.schedule_now("x", limit_key="vip")
    code, out, _ = run(redis_url, "limits", "show", "-q", queue_name, "--json")
    shown = json.loads(out)
    assert code == 0 and shown["enabled"] is True
    assert shown["limits"]["concurrency:vip"] == "4" and shown["limits"]["cap"] == "5"
    code, out, _ = run(redis_url, "limits", "show", "-q", queue_name)
    assert code == 0 and "cap 5" in out and "each key: concurrency 2, rate 10/s" in out
    # `set` replaces the queue's limits but keeps keys' own; `clear` drops everything.
    assert (
        run(redis_url, "limits", "set", "--create", "-q", queue_name, "--rate", "100/min")[0] == 0
    )
    with Queue(queue_name, redis_url) as queue:
        assert queue.limits() == Limits(rate=Rate(100, 60.0), keys={"vip": KeyLimits(4)})
    assert run(redis_url, "limits", "key", "--create", "-q", queue_name, "vip", "--clear")[0] == 0
    assert run(redis_url, "limits", "clear", "-q", queue_name)[0] == 0
    with Queue(queue_name, redis_url) as queue:
        assert queue.limits() == Limits()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("set", "--cap", "0"), "cap must be an integer from 1"),
        (("set", "--cap", "-3"), "cap must be an integer from 1"),
        (("set", "--rate", "10/parsec"), "like 10/s"),
        (("set", "--each-rate", "0/s"), "count must be an integer from 1"),
        (("set", "--rate", "5/s", "--burst", "0"), "burst must be an integer from 1"),
        (("key", "k"), "give --concurrency and/or --rate, or --clear alone"),
        (("key", "k", "--clear", "--concurrency", "1"), "or --clear alone"),
        (("key", "a\tb", "--concurrency", "1"), "control characters"),
        (("key", "k" * 10_000, "--concurrency", "1"), "at most 200"),
    ],
)
def test_bad_limits_get_a_clear_error_and_change_nothing(
    redis_url: str, queue_name: str, args: tuple[str, ...], message: str
) -> None:
    command, *rest = args
    code, _, err = run(redis_url, "limits", command, "--create", "-q", queue_name, *rest)
    assert code == EXIT_USAGE
    assert message in " ".join(err.split())
    with Queue(queue_name, redis_url) as queue:
        assert queue.limits() is None


def test_schedule_takes_a_priority_a_limit_key_and_a_cost(redis_url: str, queue_name: str) -> None:
    code, out, err = run(redis_url, "schedule", "--create", "-q", queue_name, "--in", "60",
                         "--priority", "7", "--limit-key", "acme", "--cost", "3", "{}")  # fmt: skip
    assert code == 0, err
    with Queue(queue_name, redis_url) as queue:
        status = queue.status(out.strip())
    assert status is not None
    assert (status.priority, status.limit_key, status.cost) == (7, "acme", 3)
    code, _, err = run(redis_url, "schedule", "--create", "-q", queue_name, "--in", "1",
                       "--priority", "5000", "{}")  # fmt: skip
    assert code == EXIT_USAGE and "priority must be an integer" in err


def test_reschedule_run_now_under_task_and_cron_trigger(redis_url: str, queue_name: str) -> None:
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_in(3600, {"n": 1})
        queue.add_cron("report", "0 9 * * *", {"r": 1}, limit_key="reports")
    code, out, err = run(redis_url, "reschedule", "-q", queue_name, task_id, "--in", "2h")
    assert code == 0 and out.startswith(f"{task_id} rescheduled to 20"), err  # to when
    with Queue(queue_name, redis_url) as queue:
        status = queue.status(task_id)
        assert status is not None and status.run_at is not None
        assert status.run_at - time.time() > 7000
    code, out, _ = run(redis_url, "task", "run-now", "-q", queue_name, task_id)
    assert code == 0 and out == f"{task_id} is due now\n"
    code, out, _ = run(redis_url, "cron", "trigger", "-q", queue_name, "report")
    assert code == 0
    with Queue(queue_name, redis_url) as queue:
        triggered = queue.status(out.strip())
        assert triggered is not None and triggered.limit_key == "reports"
    code, _, err = run(redis_url, "reschedule", "-q", queue_name, task_id)
    assert code == EXIT_USAGE and "exactly one of --at or --in" in err
    code, _, _ = run(redis_url, "reschedule", "-q", queue_name, "no-such", "--in", "1")
    assert code == EXIT_NOT_FOUND
    code, _, _ = run(redis_url, "cron", "trigger", "-q", queue_name, "no-such")
    assert code == EXIT_NOT_FOUND


def test_inspect_names_an_unknown_queue_and_shows_pause_and_lag(
    redis_url: str, queue_name: str
) -> None:
    code, _, err = run(redis_url, "inspect", "-q", queue_name)
    assert code == EXIT_NOT_FOUND
    assert f"no queue {queue_name!r} on this server" in " ".join(err.split())
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_in(60, {})
        queue.pause()
    code, out, _ = run(redis_url, "inspect", "-q", queue_name)
    assert code == 0
    assert "yes: workers claim nothing" in out and "promotion 0.000s, claim 0.000s" in out
