"""Server work per task, counted in instructions (callgrind): what the claim and ack steps
cost the server for a plain queue and for queues under flow control. Instruction counts
do not move with the machine's load, where wall-clock figures on a shared 2-core VM
spread by a third from one round to the next: use this to compare two revisions.

Run from the project root (needs valgrind and callgrind_control on PATH):

    .venv/bin/python bench/bench_server_work.py [--quick] [--server redis|valkey]

For each variant a fresh redis-server runs under callgrind. The tasks (3,000; ``--quick``:
600) are scheduled already due and filed (promote_due, as a dispatcher does), the
counters are zeroed, then they are claimed 50 at a time and each batch acked, as one
worker does under a backlog; the instructions the server executed meanwhile (network
handling included) are divided by the tasks. Variants: plain; priorities; a queue rate
far above the load (1,000,000/s, burst 1); 100 limit keys whose concurrency limit never
binds (100 each) and whose limit is counted at each start (2 each). Reported: the
instructions per task and their ratio to the plain queue's. Prints a markdown table and
merges its figures into ``bench/results/server_work.json``.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import bench_parser, free_port, git_revision, merge_results, server_binary

from duetime import Job, KeyLimits, Limits, Queue, Rate
from duetime.store.plans.working import Outcome

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "server_work.json"
CLAIM_BATCH = 50

#: variant -> (queue limits, each task's options)
VARIANTS: dict[str, tuple[Limits | None, Callable[[int], dict[str, Any]]]] = {
    "plain": (None, lambda n: {}),
    "priorities": (None, lambda n: {"priority": n % 7}),
    "queue rate 1,000,000/s, burst 1": (
        Limits(rate=Rate(1_000_000, 1.0, burst=1)),
        lambda n: {},
    ),
    "100 keys, concurrency 100 each": (
        Limits(each_key=KeyLimits(concurrency=100)),
        lambda n: {"limit_key": f"k{n % 100}"},
    ),
    "100 keys, concurrency 2 each": (
        Limits(each_key=KeyLimits(concurrency=2)),
        lambda n: {"limit_key": f"k{n % 100}"},
    ),
}


def instructions(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"no summary in {dump}")


def measure(kind: str, workdir: Path, variant: str, tasks: int) -> int:
    """Instructions the server executed to claim and ack ``tasks`` tasks."""
    port = free_port()
    out = workdir / f"callgrind.{port}"
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", server_binary(kind),
         "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        limits, options = VARIANTS[variant]
        with Queue("work", f"redis://127.0.0.1:{port}/0") as queue:
            deadline = time.monotonic() + 60
            while True:
                try:
                    queue.stats()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            if limits is not None:
                queue.set_limits(limits)
            due = time.time() - 1
            queue.schedule_many([Job(n, at=due, **options(n)) for n in range(tasks)])
            operations = queue.core.queue.operations
            for _ in range(tasks // 1000 + 2):
                queue.runner.run(operations.dispatcher.promote_due(1000))
            control = ["callgrind_control"]
            subprocess.run([*control, "-z", str(server.pid)], check=True, capture_output=True)
            done = 0
            while done < tasks:
                claimed = queue.runner.run(operations.worker.claim("w", 60_000, CLAIM_BATCH)) or []
                if not claimed:
                    raise RuntimeError(f"{variant}: nothing to claim after {done} tasks")
                outcomes = [Outcome(item.task_id, item.attempt) for item in claimed]
                queue.runner.run(operations.worker.ack("w", outcomes))
                done += len(claimed)
            subprocess.run([*control, "-d", str(server.pid)], check=True, capture_output=True)
    finally:
        server.terminate()
        server.wait(60)
    return instructions(Path(f"{out}.1"))


def main() -> None:
    options = bench_parser(__doc__, ["claim-ack"]).parse_args()
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not on PATH (apt-get install valgrind)")
    tasks = 600 if options.quick else 3000
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-server-work-") as scratch:
        for variant in VARIANTS:
            per_task = measure(options.server, Path(scratch), variant, tasks) / tasks
            figures[variant] = {"tasks": tasks, "instructions_per_task": round(per_task)}
            print(f"  {variant}: {per_task:,.0f} instructions a task", flush=True)
    plain = figures["plain"]["instructions_per_task"]
    lines = ["| variant | instructions a task | / plain |", "|---|---:|---:|"]
    for variant, figure in figures.items():
        figure["ratio_to_plain"] = round(figure["instructions_per_task"] / plain, 2)
        lines.append(
            f"| {variant} | {figure['instructions_per_task']:,} | {figure['ratio_to_plain']} |"
        )
    print("\n".join(lines))
    environment = {
        "server": options.server,
        "python": platform.python_version(),
        "revision": git_revision(Path(__file__).resolve().parent),
        "quick": options.quick,
    }
    merge_results(RESULTS_PATH, {"claim-ack": figures}, environment)


if __name__ == "__main__":
    main()
