"""Entry point of the processes the suite starts inside one system's own virtualenv.

    python child.py describe --system NAME
    python child.py produce  --system NAME --url URL --spec JSON --mode single|bulk|fill|roundtrip
    python child.py role     --system NAME --url URL --role ROLE --profile NAME --number K

``describe`` prints the adapter's settings and versions as JSON. ``produce`` connects,
then schedules the tasks of a ``JobSpec`` and prints how long the calls took; with
``--mode roundtrip`` it sends one bare redis-py ``LPUSH`` per task instead, through the
redis-py of the system's virtualenv: the ceiling of any single call acknowledged by the
server from this process, whatever the system stores. ``role``
replaces itself (exec) with the system's own command for that role, e.g. ``rq worker``,
so the process the suite watches and kills is the system's real worker.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for peers.*

from peers.common import PROFILES, QUEUE, Adapter, Item, JobSpec, LimitedProducer, payload


def load(system: str) -> Adapter:
    module = importlib.import_module(f"peers.adapters.{system}_adapter")
    adapter: Adapter = module.ADAPTER
    return adapter


def describe(adapter: Adapter) -> dict[str, object]:
    return {
        "name": adapter.name,
        "bulk": adapter.bulk,
        "versions": adapter.versions(),
        "python": sys.version.split()[0],
        "roles": {name: adapter.roles(p) for name, p in PROFILES.items()},
        "settings": {name: adapter.settings(p) for name, p in PROFILES.items()},
        "flow": getattr(adapter, "flow", {}),
    }


class RoundTripProducer:
    """One bare ``LPUSH`` of each task's data (as JSON) a call, one round trip each."""

    def __init__(self, url: str) -> None:
        import redis  # every system's virtualenv has redis-py (and hiredis)

        self.client = redis.Redis.from_url(url)
        self.client.ping()

    def enqueue(self, items: Sequence[Item], mode: str) -> None:
        lpush, key = self.client.lpush, f"{QUEUE}:roundtrip"
        for index, _ in items:
            lpush(key, json.dumps(payload(index)))

    def close(self) -> None:
        self.client.close()


def produce(adapter: Adapter, url: str, spec: JobSpec, mode: str) -> dict[str, object]:
    # connecting is not part of the timing
    producer = RoundTripProducer(url) if mode == "roundtrip" else adapter.producer(url)
    try:
        start = time.time() + spec.start if spec.relative else spec.start
        items = spec.items(start)
        began = time.perf_counter()
        began_wall = time.time()
        if spec.flow:
            limited: LimitedProducer = producer  # type: ignore[assignment]
            limited.enqueue_limited(items, mode, spec.flow, spec.keys)
        else:
            producer.enqueue(items, mode)
        seconds = time.perf_counter() - began
    finally:
        producer.close()
    return {"seconds": seconds, "count": len(items), "start": start, "began": began_wall}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("describe", "produce", "role"))
    parser.add_argument("--system", required=True)
    parser.add_argument("--url", default="")
    parser.add_argument("--spec", default="{}")
    parser.add_argument("--mode", default="single", choices=("single", "bulk", "fill", "roundtrip"))
    parser.add_argument("--role", default="worker")
    parser.add_argument("--profile", default="noop", choices=sorted(PROFILES))
    parser.add_argument("--number", type=int, default=1)
    args = parser.parse_args()
    adapter = load(args.system)
    if args.command == "describe":
        print(json.dumps(describe(adapter)))
    elif args.command == "produce":
        spec = JobSpec(**json.loads(args.spec))
        print(json.dumps(produce(adapter, args.url, spec, args.mode)))
    else:
        profile = PROFILES[args.profile]
        os.environ["BENCH_REDIS_URL"] = args.url
        os.environ["BENCH_HANDLER"] = profile.handler
        os.environ["BENCH_CONCURRENCY"] = str(profile.concurrency or "")
        argv = adapter.command(args.role, profile, args.url, args.number)
        sys.stdout.flush()
        os.execvp(argv[0], argv)  # PATH starts with this venv's bin/
    return 0


def spec_json(spec: JobSpec) -> str:
    return json.dumps(dataclasses.asdict(spec))


if __name__ == "__main__":
    sys.exit(main())
