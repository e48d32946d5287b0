"""What durable mode costs: single schedule calls per second on a primary with one
replica, without and with ``durable=True`` (each call then waits for the replica's WAIT
confirmation in the same round trip), in interleaved rounds on the same servers.

Run from the project root:

    .venv/bin/python bench/bench_durable.py [--calls N] [--rounds R]

Both servers are started here on free loopback ports (system ``redis-server``) and
stopped at the end. On one host the replica is a loopback hop away, so this is a lower
bound on the cost; across machines, add their round-trip time to every durable call.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from duetime import Queue
from tests.servers import Server  # the project's throwaway-server launcher


def rate(queue: Queue, calls: int) -> float:
    start = time.perf_counter()
    for n in range(calls):
        queue.schedule_in(3600, {"n": n})
    return calls / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    executable = shutil.which("redis-server")
    if executable is None:
        sys.exit("redis-server is not on PATH")
    primary = Server("redis", executable)
    primary.start()
    replica = Server("redis", executable, extra=["--replicaof", "127.0.0.1", str(primary.port)])
    replica.start()
    try:
        client = primary.client()
        while client.info("replication").get("slave0", {}).get("state") != "online":
            time.sleep(0.05)
        client.close()
        rates: dict[str, list[float]] = {"plain": [], "durable": []}
        with (
            Queue("bench", primary.url) as plain,
            Queue("bench", primary.url, durable=True) as durable,
        ):
            rate(plain, 200)  # warm up: scripts loaded, clock sampled
            rate(durable, 200)
            for _ in range(args.rounds):
                rates["plain"].append(rate(plain, args.calls))
                rates["durable"].append(rate(durable, args.calls))
        plain_rate = statistics.median(rates["plain"])
        durable_rate = statistics.median(rates["durable"])
        print(f"| mode | schedule calls/s (median of {args.rounds}) | µs per call |")
        print("|---|---:|---:|")
        for name, value in (("plain", plain_rate), ("durable (1 replica)", durable_rate)):
            print(f"| {name} | {value:,.0f} | {1e6 / value:,.0f} |")
        print(f"\ndurable / plain: {durable_rate / plain_rate:.2f}")
    finally:
        replica.stop()
        primary.stop()


if __name__ == "__main__":
    main()
