"""Every command that names a queue refuses one this server never saw (exit 4, the known
queues suggested, nothing written), as ``inspect`` does, unless it takes --create and
is given it: a typo (``duetime pause emials``) never reports a success."""

from __future__ import annotations

import logging

import click
import pytest
import redis
from click.testing import CliRunner

from duetime import Queue, known_queues
from duetime.cli import EXIT_NOT_FOUND, main
from duetime.store.plans.layout import QUEUE_REGISTRY

#: The arguments each command is given besides its queue (valid ones: what refuses is the
#: queue), by command path; a command that names a queue and has no row fails the first
#: test. Daemons are left out: starting one for a queue is how it comes to be (a
#: dashboard is refused, see below).
ARGUMENTS: dict[str, list[str]] = {
    "schedule": ["--in", "1h", "{}"],
    "status": ["t1"],
    "cancel": ["t1"],
    "tasks": [],
    "task show": ["t1"],
    "task run-now": ["t1"],
    "run-now": ["t1"],
    "reschedule": ["t1", "--in", "1h"],
    "search": ["--task", "send"],
    "bulk cancel": ["--task", "send", "--yes"],
    "bulk run-now": ["--task", "send", "--yes"],
    "bulk reschedule": ["--task", "send", "--in", "1h", "--yes"],
    "inspect": [],
    "pause": [],
    "resume": [],
    "history-size": ["20"],
    "dead list": [],
    "dead show": ["t1"],
    "dead requeue": ["--all", "--yes"],
    "dead purge": ["--all", "--yes"],
    "cron add": ["job", "* * * * *", "{}"],
    "cron list": [],
    "cron pause": ["job"],
    "cron resume": ["job"],
    "cron trigger": ["job"],
    "cron backfill": ["job", "--from", "2h", "--to", "1h"],
    "cron remove": ["job"],
    "limits show": [],
    "limits set": ["--cap", "5"],
    "limits key": ["k", "--concurrency", "2"],
    "limits clear": [],
}
DAEMONS = {"dispatcher", "worker", "run", "dashboard"}
#: The commands that write and may create a queue with --create.
CREATING = {"schedule", "pause", "history-size", "cron add", "limits set", "limits key"}


def _commands(command: click.Command, path: str = "") -> dict[str, click.Command]:
    if isinstance(command, click.Group):
        found: dict[str, click.Command] = {}
        for name, sub in command.commands.items():
            found |= _commands(sub, f"{path} {name}".strip())
        return found
    return {path: command}


def _names_a_queue(command: click.Command) -> bool:
    return any(p.name in ("queue", "queues", "queue_name") for p in command.params)


def _invocation(path: str, queue: str, *extra: str) -> list[str]:
    if path in ("pause", "resume"):
        return [path, queue, *extra, *ARGUMENTS[path]]
    return [*path.split(), "-q", queue, *extra, *ARGUMENTS[path]]


@pytest.fixture
def cli(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    return CliRunner()


def test_the_table_covers_every_command_that_names_a_queue() -> None:
    commands = _commands(main)
    naming = {path for path, command in commands.items() if _names_a_queue(command)}
    assert naming - DAEMONS == set(ARGUMENTS)
    creating = {path for path, command in commands.items() if "create" in _params(command)}
    assert creating == CREATING


def _params(command: click.Command) -> set[str]:
    return {p.name for p in command.params if p.name}


@pytest.mark.parametrize("path", sorted(ARGUMENTS))
def test_an_unknown_queue_is_refused_with_the_known_ones_suggested(
    cli: CliRunner, redis_url: str, raw: redis.Redis, path: str
) -> None:
    with Queue("emails", redis_url) as queue:
        queue.schedule_in(3600, {"to": "a@b"})
    keys = sorted(raw.keys())
    result = cli.invoke(main, _invocation(path, "emials"))
    assert result.exit_code == EXIT_NOT_FOUND, result.output
    assert "no queue 'emials' on this server" in result.output
    assert "did you mean 'emails'?" in result.output
    assert ("pass --create" in result.output) == (path in CREATING)
    assert sorted(raw.keys()) == keys  # nothing written, the registry included


@pytest.mark.parametrize("path", sorted(CREATING))
def test_create_writes_to_a_new_queue_which_is_known_from_then_on(
    cli: CliRunner, redis_url: str, path: str
) -> None:
    created = cli.invoke(main, _invocation(path, "fresh", "--create"))
    assert created.exit_code == 0, created.output
    assert [queue.name for queue in known_queues(redis_url)] == ["fresh"]
    again = cli.invoke(main, ["inspect", "-q", "fresh"])
    assert again.exit_code == 0, again.output


def test_a_server_with_no_queue_says_so(cli: CliRunner) -> None:
    result = cli.invoke(main, ["pause", "emails"])
    assert result.exit_code == EXIT_NOT_FOUND
    assert "it knows no queue yet" in result.output and "pass --create" in result.output


def test_the_known_queues_are_listed_when_none_is_close(cli: CliRunner, redis_url: str) -> None:
    for name in ("billing", "reports"):
        with Queue(name, redis_url) as queue:
            queue.schedule_in(3600, {})
    result = cli.invoke(main, ["tasks", "-q", "zzz"])
    assert result.exit_code == EXIT_NOT_FOUND
    assert "the queues it knows: billing, reports" in result.output


def test_a_queue_with_tasks_but_no_registry_entry_is_known(
    cli: CliRunner, redis_url: str, raw: redis.Redis
) -> None:
    """Data written before the registry existed (or by a client whose ACL denied the
    note) still makes the queue known."""
    with Queue("emails", redis_url) as queue:
        queue.schedule_in(3600, {})
    raw.delete(QUEUE_REGISTRY)
    assert known_queues(redis_url) == []
    result = cli.invoke(main, ["tasks", "-q", "emails"])
    assert result.exit_code == 0, result.output


def test_a_dashboard_refuses_an_unknown_queue_and_daemons_warn(
    cli: CliRunner, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with Queue("emails", redis_url) as queue:
        queue.schedule_in(3600, {})
    result = cli.invoke(main, ["dashboard", "-q", "emails", "-q", "emials"])
    assert result.exit_code == EXIT_NOT_FOUND, result.output
    assert "did you mean 'emails'?" in result.output
    from duetime.cli.daemons import check_queues
    from duetime.settings import Settings

    with caplog.at_level(logging.WARNING, logger="duetime"), click.Context(main):
        check_queues(("emials",), redis_url, Settings(), served=True)
    assert "no queue 'emials' on this server" in caplog.text
    assert "serving it as a new queue" in caplog.text
