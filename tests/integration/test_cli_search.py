"""``duetime search`` and ``duetime bulk`` on a real server (both kinds): matches by
every criterion with the cost said, a cursor to go on, --all to the end, JSON; bulk
actions on named ids or a search's matches, with their confirmation, dry runs and the
tasks they skipped."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from duetime import Job, Queue
from duetime.cli import EXIT_DECLINED, EXIT_NOTHING_DONE, EXIT_USAGE, main
from duetime.states import TaskState


@pytest.fixture
def cli(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    return CliRunner()


@pytest.fixture
def orders(redis_url: str, queue_name: str) -> list[str]:
    """1,200 scheduled tasks (more than a hash keeps compact, so a walk takes pages):
    ``order-0000`` to ``order-1199``, customer ``acme`` for the even ones, plus one
    ready task of acme's."""
    with Queue(queue_name, redis_url) as queue:
        jobs = [
            Job({"customer": "acme" if n % 2 == 0 else "zeta", "n": n}, delay=3600,
                id=f"order-{n:04}", task="invoice")
            for n in range(1200)
        ]  # fmt: skip
        queue.schedule_many(jobs)
        queue.schedule_now({"customer": "acme", "n": -1}, id="order-ready", task="invoice")
    return [job.id for job in jobs if job.id is not None]


def test_search_prints_the_matches_what_it_read_and_the_cursor_to_go_on(
    cli: CliRunner, queue_name: str, orders: list[str]
) -> None:
    one = cli.invoke(main, ["search", "-q", queue_name, "--id", "order-0042"])
    assert one.exit_code == 0, one.output
    assert "order-0042" in one.stdout and "scheduled" in one.stdout
    assert "1 match; read 1,201 of 1,201 tasks in" in one.stderr

    bounded = cli.invoke(
        main, ["search", "-q", queue_name, "--data", "n=7", "--budget", "300", "--json"]
    )
    assert bounded.exit_code == 0, bounded.output
    report = json.loads(bounded.stdout)
    assert report["total"] == 1201 and 0 < report["scanned"] < 1201
    assert report["cursor"] and report["walked"] == "tasks"

    found: set[str] = set()
    cursor = None
    while True:  # each call goes on from the cursor the one before printed
        arguments = ["search", "-q", queue_name, "--data", "customer=acme", "--budget", "400"]
        arguments += ["--limit", "10000", "--json"] + (["--cursor", cursor] if cursor else [])
        page = json.loads(cli.invoke(main, arguments).stdout)
        found |= {task["id"] for task in page["tasks"]}
        if (cursor := page["cursor"]) is None:
            break
    assert found == {*orders[::2], "order-ready"}

    everything = cli.invoke(
        main, ["search", "-q", queue_name, "--data", "customer=acme", "--state", "ready",
               "--all", "--budget", "500", "--json"],
    )  # fmt: skip
    report = json.loads(everything.stdout)
    assert [task["id"] for task in report["tasks"]] == ["order-ready"]
    assert report["cursor"] is None and report["scanned"] >= 1201

    nothing = cli.invoke(main, ["search", "-q", queue_name])
    assert nothing.exit_code == EXIT_USAGE and "search by --id" in nothing.output
    bad = cli.invoke(main, ["search", "-q", queue_name, "--task", "x", "--cursor", "nope"])
    assert bad.exit_code == EXIT_USAGE and "not a search cursor" in bad.output


def test_bulk_actions_on_named_ids_and_on_a_search(
    cli: CliRunner, redis_url: str, queue_name: str, orders: list[str]
) -> None:
    named = cli.invoke(
        main, ["bulk", "run-now", "-q", queue_name, "order-0001", "order-ready", "ghost"]
    )
    assert named.exit_code == 0, named.output
    assert named.stdout.strip() == "made due now 1; skipped 2 (1 gone, 1 ready)"
    assert "skipped ghost: gone" in named.stderr

    search = ["--data", "customer=zeta", "--id", "order-00"]  # 50 of the 100 order-00..
    dry = cli.invoke(main, ["bulk", "cancel", "-q", queue_name, *search, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    # order-0001 is ready now: not started either, so taken too.
    assert "would cancel 50 of 50 matching tasks in" in dry.stdout
    assert "(1 ready, 49 scheduled)" in dry.stdout
    declined = cli.invoke(main, ["bulk", "cancel", "-q", queue_name, *search], input="n\n")
    assert declined.exit_code == EXIT_DECLINED and "nothing changed" in declined.output
    with Queue(queue_name, redis_url) as queue:
        assert queue.stats().scheduled == 1199

    later = time.time() + 7200
    moved = cli.invoke(
        main, ["bulk", "reschedule", "-q", queue_name, *search, "--at", str(later), "--json"],
        input="y\n",
    )  # fmt: skip
    assert moved.exit_code == 0, moved.output
    report = json.loads(moved.stdout[moved.stdout.index("{") :])
    assert report["done"] == 50 and report["skipped"] == {}
    assert report["run_at"] == pytest.approx(later, abs=0.001)
    cancelled = cli.invoke(main, ["bulk", "cancel", "-q", queue_name, *search, "--yes"])
    assert cancelled.stdout.strip() == "50 matched: 50 cancelled"
    with Queue(queue_name, redis_url) as queue:
        assert queue.stats().scheduled == 1150
        status = queue.status("order-0002")  # acme's: left alone
        assert status is not None and status.state == TaskState.SCHEDULED
        assert queue.status("order-0003") is None

    both = cli.invoke(main, ["bulk", "cancel", "-q", queue_name, "order-0002", "--task", "x"])
    assert both.exit_code == EXIT_USAGE
    when = cli.invoke(main, ["bulk", "reschedule", "-q", queue_name, "order-0002"])
    assert when.exit_code == EXIT_USAGE and "--at or --in" in when.output


def test_search_keeps_to_its_limit_and_lists_by_run_at(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    # Written latest run-at first: a small hash walks in the order it was written.
    now = time.time()
    with Queue(queue_name, redis_url) as queue:
        ids = queue.schedule_many(
            [Job({"n": n}, at=now + 3600 * (10 - n), id=f"job-{n}", task="t") for n in range(10)]
        )
    by_run_at = ids[::-1]
    listed = cli.invoke(main, ["search", "-q", queue_name, "--task", "t", "--json"])
    assert [task["id"] for task in json.loads(listed.stdout)["tasks"]] == by_run_at

    three = cli.invoke(main, ["search", "-q", queue_name, "--task", "t", "--limit", "3"])
    assert three.exit_code == 0, three.output
    assert "3 matches;" in three.stderr and "--cursor" in three.stderr
    assert sum(line.startswith("job-") for line in three.stdout.splitlines()) == 3
    seen: list[str] = []
    cursor = None
    while True:  # the cursor goes on after the last match given: each once, none lost
        arguments = ["search", "-q", queue_name, "--task", "t", "--limit", "3", "--json"]
        page = json.loads(
            cli.invoke(main, arguments + (["--cursor", cursor] if cursor else [])).stdout
        )
        assert len(page["tasks"]) <= 3
        seen += [task["id"] for task in page["tasks"]]
        if (cursor := page["cursor"]) is None:
            break
    assert sorted(seen) == sorted(ids)


def test_bulk_says_when_it_moved_tasks_to_and_exits_8_when_it_did_nothing(
    cli: CliRunner, redis_url: str, queue_name: str, orders: list[str]
) -> None:
    at = "2030-01-02T03:04:05Z"
    moved = cli.invoke(main, ["bulk", "reschedule", "-q", queue_name, "order-0001", "--at", at])
    assert moved.exit_code == 0, moved.output
    assert moved.stdout.strip() == "rescheduled 1 to 2030-01-02 03:04:05+00:00"

    skipped = cli.invoke(main, ["bulk", "run-now", "-q", queue_name, "order-ready", "ghost"])
    assert skipped.exit_code == EXIT_NOTHING_DONE
    assert skipped.stdout.strip() == "made due now 0; skipped 2 (1 gone, 1 ready)"
    by_search = cli.invoke(
        main, ["bulk", "run-now", "-q", queue_name, "--id", "order-ready", "--yes"]
    )
    assert by_search.exit_code == EXIT_NOTHING_DONE
    assert by_search.stdout.strip() == "1 matched: 0 made due now, 1 skipped (1 ready)"
    none = cli.invoke(main, ["bulk", "cancel", "-q", queue_name, "--id", "nothing-", "--yes"])
    assert none.exit_code == 0 and none.stdout.strip() == "0 matched: 0 cancelled"
