"""examples/demo.py as `make demo` runs it (#33): it passes on the embedded server, and
the commands it suggests run as printed, from the checkout, with the virtualenv not
activated (make does not activate it)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def without_the_virtualenv(path: str) -> str:
    """PATH without this interpreter's bin directory, as after `make demo`."""
    bin_directory = Path(sys.executable).parent.absolute()
    return os.pathsep.join(
        entry for entry in path.split(os.pathsep) if Path(entry).absolute() != bin_directory
    )


def run(command: list[str], environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )


def test_the_demo_passes_and_its_suggestions_run_as_printed(embedded_home: Path) -> None:
    environment = {**os.environ, "COLUMNS": "80"}
    environment["PATH"] = without_the_virtualenv(environment["PATH"])
    demo = run([sys.executable, "examples/demo.py"], environment)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "invariant check: all hold" in demo.stdout
    assert "every project of yours that gives no Redis URL shares it" in demo.stdout

    [inspect] = re.findall(r"inspect it: (.+)$", demo.stdout, re.MULTILINE)
    [queues, stop] = re.findall(r"`([^`]+ (?:queues|server stop))`", demo.stdout)
    shown = run(shlex.split(inspect), environment)
    assert shown.returncode == 0, shown.stderr
    assert "report template missing" in shown.stdout
    listed = run(shlex.split(queues), environment)
    assert listed.returncode == 0 and "demo" in listed.stdout
    stopped = run(shlex.split(stop), environment)
    assert (stopped.returncode, stopped.stdout.strip()) == (0, "stopped")
