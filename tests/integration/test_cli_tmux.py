"""The command line in a real 80-column terminal (#33): a tmux pane, so the width comes
from the terminal itself (no COLUMNS). Ids in tables are shown whole on one screen line,
and an error's hint is one line as written: where it is longer than the pane, the
terminal folds it (and gives it back whole when copied), never the program.

tmux is Debian's package (`apt-get install tmux`; .ci/run installs it): the test is
skipped without it locally, and fails without it in CI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from duetime import KeyLimits, Limits, Queue, Rate, codec
from duetime.codec import ErrorRecord
from tests.conftest import IN_CI
from tests.helpers import wait_until_sync

WIDTH = 80


@dataclass
class Pane:
    """A shell in a detached tmux session of its own (its own server socket, no user
    configuration), WIDTH columns wide."""

    socket: Path
    environment: dict[str, str]
    runs: int = field(default=0)

    def tmux(self, *args: str) -> str:
        command = ["tmux", "-S", str(self.socket), "-f", "/dev/null", *args]
        done = subprocess.run(
            command, env=self.environment, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def run(self, command: str, joined: bool = False) -> list[str]:
        """Type ``command`` at the prompt, wait for it to end, and return the lines it
        wrote. Its output is framed by two echoes the shell computes, so the typed line
        itself never matches them, and nothing depends on when a screen was cleared.
        ``joined``: as ``screen``."""
        self.runs += 1
        start, end = f"START-{1000 + self.runs}", f"END-{1000 + self.runs}"
        typed = f"echo START-$((1000+{self.runs})); {command}; echo END-$((1000+{self.runs}))"
        self.tmux("send-keys", "-t", "cli", "-l", typed)
        self.tmux("send-keys", "-t", "cli", "Enter")
        wait_until_sync(
            lambda: end in self.screen().splitlines(), timeout=60, what=f"{command!r} to end"
        )
        lines = self.screen(joined).splitlines()
        return lines[lines.index(start) + 1 : lines.index(end)]

    def screen(self, joined: bool = False) -> str:
        """The pane's lines as shown; with ``joined``, lines the terminal folded are given
        back whole (as a copy from the terminal gives them), lines the program broke are
        not."""
        return self.tmux("capture-pane", "-p", "-t", "cli", "-S", "-", *(["-J"] if joined else []))


@pytest.fixture
def pane(redis_url: str, tmp_path: Path) -> Iterator[Pane]:
    if shutil.which("tmux") is None:
        message = "no tmux (apt-get install tmux)"
        if IN_CI:
            pytest.fail(f"{message}: CI must run the terminal test")
        pytest.skip(message)
    environment = {
        name: value for name, value in os.environ.items() if name not in ("COLUMNS", "LINES")
    }
    # `duetime` is this interpreter's, whether or not its virtualenv is active.
    environment["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), environment["PATH"]])
    environment |= {"DUETIME_REDIS_URL": redis_url, "TERM": "xterm-256color", "PS1": "$ "}
    socket = Path("/tmp") / f"dt-tmux-{uuid.uuid4().hex[:8]}"  # short: a Unix socket
    found = Pane(socket, environment)
    found.tmux("new-session", "-d", "-s", "cli", "-x", str(WIDTH), "-y", "50", "sh")
    try:
        assert found.tmux("display-message", "-p", "-t", "cli", "#{pane_width}").strip() == "80"
        yield found
    finally:
        found.tmux("kill-server")
        socket.unlink(missing_ok=True)


def test_ids_whole_and_hints_unbroken_in_an_80_column_pane(pane: Pane, queue_name: str) -> None:
    long_ids = [f"cron:flaky-maintenance-job:18000000{n:05d}" for n in range(4)]
    with Queue(queue_name, pane.environment["DUETIME_REDIS_URL"]) as queue:
        for task_id in long_ids:
            queue.schedule_in(3600, {"error": "x" * 200}, id=task_id, task="a_handler_name")

    lines = pane.run(f"duetime tasks -q {queue_name} --state scheduled")
    assert any(line.split()[:3] == ["id", "run", "at"] for line in lines if line), lines
    for task_id in long_ids:
        assert any(task_id in line for line in lines), f"{task_id} cut: {lines}"

    missing = "no-such-queue-" + "q" * 30
    output = pane.run(f"duetime inspect -q {missing}", joined=True)
    # The error, as the terminal gives it back: one line, from its start to its hint.
    [error] = [line for line in output if "no queue" in line]
    assert missing in error and error.endswith("(check the name, --shards and --redis)")
    assert len(error) > WIDTH  # the premise: longer than the pane, so the terminal folded it


ERROR = "ConnectionError: the mail relay at smtp.example.com:587 refused the connection"
CRON_TICK = "cron:flaky-maintenance-job:1800000000000"
LIMIT_KEYS = [f"customer-enterprise-eu-west-1-tenant-{n:04d}" for n in range(5)]
CRON_NAMES = ["nightly-maintenance-report-eu", "every-five-minutes-cleanup-job"]


def fill_listings(redis_url: str, queue_name: str) -> list[str]:
    """Four tasks that ran once and died with an error (one of them a cron tick: the
    longest id a listing shows), so they are dead, in the history and found by their
    error; two cron jobs with long names and several policies; and a second queue under
    flow control, whose five keys share a long prefix, each with a due task. Returns the
    dead ids."""
    with Queue(queue_name, redis_url) as queue:
        ids = [queue.schedule_now({"n": n}, task="send_email", max_attempts=1) for n in range(3)]
        ids.append(queue.schedule_now({}, id=CRON_TICK, task="send_email", max_attempts=1))
        ops, run = queue.core.queue.operations, queue.runner.run
        claimed = run(ops.worker.claim("web-1.4117", 60_000, len(ids))) or []
        for task in claimed:
            record = codec.encode_error(ErrorRecord(ERROR, "Traceback ...", 1, 0, "web-1.4117"))
            run(
                ops.worker.fail(
                    "web-1.4117", task.task_id, task.attempt, record, None, summary=ERROR
                )
            )
        queue.add_cron(
            CRON_NAMES[0], "30 2 * * *", {}, tz="America/New_York", task="send_email",
            missed="once", overlap="skip", jitter=30, catch_up=3600, max_runs=100,
        )  # fmt: skip
        queue.add_cron(CRON_NAMES[1], None, {}, every=300, task="send_email")
    with Queue(f"{queue_name}-flow", redis_url) as flowing:
        flowing.set_limits(Limits(cap=5, each_key=KeyLimits(2, Rate(10))))
        for key in LIMIT_KEYS:
            flowing.set_key_limits(key, KeyLimits(3, Rate(100, 60.0)))
            flowing.schedule_now({}, limit_key=key)
        flowing.runner.run(flowing.core.queue.operations.dispatcher.promote_due(100))
    return ids


def words(lines: list[str]) -> str:
    """The lines' text with every run of spaces and line ends as one space."""
    return " ".join(" ".join(lines).split())


def test_listings_keep_the_columns_that_answer_them_in_an_80_column_pane(
    pane: Pane, queue_name: str
) -> None:
    """#41: in 80 columns each listing keeps what it is read for (a dead task's error,
    an attempt's outcome, the error a search matched, whole limit keys and cron names),
    and folds the rest under each row rather than dropping a column."""
    ids = fill_listings(pane.environment["DUETIME_REDIS_URL"], queue_name)

    def run(command: str) -> list[str]:
        lines = [line for line in pane.run(command, joined=True) if line.strip()]
        assert max(len(line) for line in lines) <= WIDTH, lines  # the program's own lines
        return lines

    def row(lines: list[str], first: str) -> str:
        [found] = [line for line in lines if line.split()[0] == first]
        return found

    for command in (
        f"duetime dead list -q {queue_name}",
        f"duetime search -q {queue_name} --error relay",
    ):
        lines = run(command)
        for task_id in ids:
            row(lines, task_id)  # whole, on a line of its own
        assert words(lines).count(f"error: {ERROR}") == len(ids), lines

    lines = run(f"duetime tasks -q {queue_name} --state finished")
    assert lines[0].split()[-1] == "outcome", lines
    for task_id in ids:
        assert row(lines, task_id).split()[-1] == "dead", lines
    assert words(lines).count(f"error: {ERROR}") == len(ids), lines

    lines = run(f"duetime limits show -q {queue_name}-flow")
    # The keys that have due tasks waiting (the dispatcher may have let one or two run),
    # each whole: keys that share a prefix are told apart.
    shown = [line.split()[0] for line in lines if line.startswith("customer-")]
    assert len(shown) >= 3 and len(set(shown)) == len(shown), lines
    assert set(shown) <= set(LIMIT_KEYS), lines

    lines = run(f"duetime cron list -q {queue_name}")
    starts = sorted(lines.index(row(lines, name)) for name in CRON_NAMES)
    assert starts[0] == 2, lines  # after the heading and its rule
    # Each job: its three next runs and one line of policies, not one policy per line.
    assert starts[1] - starts[0] <= 4 and len(lines) - starts[1] <= 4, lines
    assert "policies: missed once, overlap skip, catch-up 1h, jitter 30s" in words(lines)
