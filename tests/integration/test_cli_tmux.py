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

from duetime import Queue
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
