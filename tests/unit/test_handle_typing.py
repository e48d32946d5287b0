"""A type checker follows typed handles: mypy (--strict, the project's settings) passes
code that schedules a handler's own data type through ``queue.task(handler)``, and
reports each wrong one, on the line marked with the error code expected; and a handle
takes the options of the schedule calls, but ``task``."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import get_type_hints

from duetime.client import HandleOptions, TaskOptions
from duetime.client.models import TASK_OPTIONS

ROOT = Path(__file__).resolve().parents[2]

HANDLERS = """\
from typing import TypedDict

import duetime

app = duetime.App()


class Email(TypedDict):
    to: str
    subject: str


@app.task
def send_email(data: Email) -> None: ...


@app.task
async def resize(data: list[int]) -> int:
    return sum(data)
"""

GOOD = """\
from typing import assert_type

import duetime
from handlers import Email, resize, send_email


def produce(queue: duetime.Queue) -> list[str]:
    send_email({"to": "ada@example.com", "subject": "hi"})  # still a plain function
    handle = queue.task(send_email)
    assert_type(handle, duetime.TaskHandle[Email])
    email: Email = {"to": "ada@example.com", "subject": "hi"}
    first = handle.schedule_in(10, email, priority=2, id="welcome-ada")
    return [first, handle.schedule_now(email), *handle.schedule_many([(0, email)])]


async def produce_async(queue: duetime.AsyncQueue) -> str:
    handle = queue.task(resize)
    assert_type(handle, duetime.AsyncTaskHandle[list[int]])
    return await handle.schedule_task(0, [1, 2], limit_key="images")


async def follow_up(data: list[int]) -> None:
    queue = duetime.current_task().queue
    assert isinstance(queue, duetime.AsyncQueue)
    await queue.task(resize).schedule_in(60, data)
"""

BAD = """\
import duetime
from handlers import resize, send_email


async def produce(queue: duetime.Queue, later: duetime.AsyncQueue) -> None:
    queue.task(send_email).schedule_in(10, {"to": 1, "subject": "hi"})  # typeddict-item
    queue.task(send_email).schedule_now("ada@example.com")  # arg-type
    queue.task(send_email).schedule_now({"to": "ada@example.com"})  # typeddict-item
    await later.task(resize).schedule_in(10, [1], task="other")  # call-arg
    await later.task(resize).schedule_many([(0, ["1"])])  # list-item
    count: int = queue.task(send_email).schedule_now({"to": "a", "subject": "b"})  # assignment
"""


def _expected(source: str) -> set[tuple[int, str]]:
    marked = (re.search(r"# ([a-z-]+)$", line) for line in source.splitlines())
    return {(number, mark.group(1)) for number, mark in enumerate(marked, 1) if mark}


def test_mypy_passes_a_handlers_own_data_type_and_reports_each_wrong_one(tmp_path: Path) -> None:
    for name, source in [("handlers", HANDLERS), ("good", GOOD), ("bad", BAD)]:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-error-summary",
            "--hide-error-context",
            "good.py",
            "bad.py",
            "handlers.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = re.findall(r"^(\w+)\.py:(\d+): error: .*\[([a-z-]+)\]$", checked.stdout, re.M)
    assert [error for error in errors if error[0] != "bad"] == [], checked.stdout
    assert {(int(line), code) for _, line, code in errors} == _expected(BAD), checked.stdout
    assert checked.returncode == 1, checked.stderr


def test_a_handle_takes_every_schedule_option_but_the_task_it_gives() -> None:
    handle_options = get_type_hints(HandleOptions)
    assert set(handle_options) == TASK_OPTIONS - {"task"}
    assert handle_options == {
        name: kind for name, kind in get_type_hints(TaskOptions).items() if name != "task"
    }
