"""duetime side by side with RQ, arq, Dramatiq, Huey, Celery, SAQ, BullMQ and Docket.

Run from the project root with any Python 3.11+:

    python3 bench/peers/run.py [--quick] [--scenario NAME ...] [--system NAME ...] [--repeat N]

It first builds (or reuses) one virtualenv per system under bench/.venv-peers/ (see
venvs.py; never the project's .venv), then runs itself again inside the ``duetime`` one,
which holds duetime (editable), redis-py and matplotlib. It starts its own redis-server on
a free loopback port (never 6379), runs the scenarios (see scenarios.py), kills everything
it started, and writes bench/results/peers.json, peers.md and peers.png.

Scenarios: punctuality, throughput, enqueue, memory, scale, recovery (all by default),
and flow, run only when named (``--scenario flow``; see flow.py): a rate limit on one key
and a concurrency limit per key, for duetime, Docket, Celery and Dramatiq by default.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchlib, peers.*

from peers.venvs import RUNNER, VENVS, ensure


def main() -> int:
    runner = VENVS / RUNNER
    if Path(sys.prefix).resolve() != runner.resolve():
        venv = ensure(RUNNER)
        if venv.error:
            print(f"cannot build the runner venv: {venv.error}", file=sys.stderr)
            return 1
        os.execv(venv.python, [str(venv.python), __file__, *sys.argv[1:]])
    from peers.suite import main as suite_main

    return suite_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
