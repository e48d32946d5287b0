"""``duetime schedule`` with --debounce, --throttle and --unique: the id of the task that
carries the call on stdout, what the call did on stderr, and ``duetime status`` showing
the task's key; options of another mode are usage errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from duetime import Queue
from duetime.cli import EXIT_USAGE, main


@pytest.fixture
def cli(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    monkeypatch.setenv("TZ", "UTC")
    return CliRunner()


def test_debounced_calls_print_one_id_and_say_they_collapsed(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    call = ["schedule", "--create", "-q", queue_name, "--debounce", "user-42", "--window", "1h"]
    first = cli.invoke(main, [*call, "--max-wait", "2h", "--collect", "all", '{"n": 1}'])
    assert first.exit_code == 0, first.output
    assert first.stderr.startswith("created: runs at ")
    second = cli.invoke(main, [*call, "--collect", "all", '{"n": 2}'])
    assert second.exit_code == 0, second.output
    assert second.stdout == first.stdout
    assert second.stderr.startswith("collapsed into the waiting task (2 calls): runs at ")
    task_id = first.stdout.strip()
    status = cli.invoke(main, ["--utc", "status", "-q", queue_name, task_id])
    shown = json.loads(status.stdout)
    assert shown["data"] == [{"n": 1}, {"n": 2}]
    assert shown["keyed"]["mode"] == "debounce" and shown["keyed"]["key"] == "user-42"
    assert shown["keyed"]["calls"] == 2 and shown["keyed"]["until"].endswith("+00:00")


def test_throttle_and_unique_calls_say_what_they_did(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    throttle = ["schedule", "--create", "-q", queue_name, "--throttle", "api", "--window", "1h"]
    lead = cli.invoke(main, [*throttle, "{}"])
    dropped = cli.invoke(main, [*throttle, "{}"])
    assert dropped.stdout == lead.stdout and dropped.stderr.startswith("dropped: throttled until")
    unique = ["schedule", "--create", "-q", queue_name, "--unique", "nightly", "--in", "1h"]
    made = cli.invoke(main, [*unique, "--until", "finished", "{}"])
    again = cli.invoke(main, [*unique, "{}"])
    assert again.stdout == made.stdout
    assert again.stderr.strip() == "existing: the key's task is scheduled"
    with Queue(queue_name, redis_url) as queue:
        assert queue.stats().scheduled == 1 and queue.stats().ready == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--debounce", "k"], "--debounce needs --window"),
        (
            ["--debounce", "k", "--unique", "k", "--window", "1s"],
            "and --unique, not --debounce and --unique",
        ),
        (["--window", "1s"], "--window goes with --debounce or --throttle"),
        (["--unique", "k", "--max-wait", "1s"], "--max-wait goes with --debounce"),
        (["--debounce", "k", "--window", "1s", "--trailing"], "--trailing goes with --throttle"),
        (["--throttle", "k", "--window", "1s", "--until", "finished"], "--until goes with"),
        (["--debounce", "k", "--window", "10s", "--max-wait", "5s"], "at least its window"),
        (["--debounce", "k", "--window", "1s", "--id", "x"], "leave out id"),
        (["--debounce", "", "--window", "1s"], "non-empty"),
    ],
)
def test_keyed_options_of_another_mode_or_out_of_range_are_usage_errors(
    cli: CliRunner, queue_name: str, arguments: list[str], message: str
) -> None:
    result = cli.invoke(main, ["schedule", "--create", "-q", queue_name, *arguments, "{}"])
    assert result.exit_code == EXIT_USAGE, result.output
    assert message in result.output
