"""The opt-in ``flow`` scenario (``run.py --scenario flow``): duetime's flow control beside
the limits of the peers that have some: Docket (``RateLimit``, ``ConcurrencyLimit``),
Celery (``rate_limit``, a token bucket in each worker node) and Dramatiq
(``WindowRateLimiter``, ``ConcurrentRateLimiter`` with its Redis backend). Each adapter
says in ``flow`` which limits it has and how they are used; a limit a system lacks is
not measured for it.

Per system and run, two measurements, each with a backlog written before FLOW_WORKERS
worker processes start, then watched for ``seconds`` from the first start:

- ``rate``: FLOW_RATE starts a second on one key. The start rate achieved (starts in the
  span / its length) and the most starts in any one second (a half-open span beginning
  at a start): the overshoot, against the limit. Starts are the handlers' stamps, after
  whatever admission the system does (a Docket dependency, a Dramatiq limiter acquired in
  the actor).
- ``concurrency``: at most FLOW_CONCURRENCY at once per key, FLOW_KEYS keys, each task
  FLOW_TASK_SECONDS long. The most tasks of one key running at once (from the handlers'
  start and end stamps) and tasks/s, against FLOW_KEYS x FLOW_CONCURRENCY /
  FLOW_TASK_SECONDS.

Two worker processes, so that a limit has to hold across processes (Celery's does not:
it is per node, so two nodes may start twice its rate; that is its documented design).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from peers.common import (
    FLOW_CONCURRENCY,
    FLOW_KEYS,
    FLOW_RATE,
    FLOW_TASK_SECONDS,
    JobSpec,
    Stamp,
    key_of,
    read_stamps,
)
from peers.harness import ChildError, Harness, System

FLOW_WORKERS = 2  # worker processes per system: the limits must hold across them
LIMITS = ("rate", "concurrency")
#: The systems whose adapters have flow limits: the default systems of a flow-only run.
SYSTEMS = ("duetime", "docket", "celery", "dramatiq")


@dataclass(frozen=True, slots=True)
class FlowSizes:
    seconds: float  # the span watched from the first start
    startup_cap: float  # how long the workers may take to start the first task


FULL = FlowSizes(30.0, 60.0)
QUICK = FlowSizes(10.0, 60.0)


def supported(system: System) -> dict[str, str]:
    """The limits the system has, with how its adapter uses them."""
    flow: dict[str, str] = system.info.get("flow", {})
    return flow


def most_in_a_second(starts: list[float]) -> int:
    """The most starts in any half-open span [t, t + 1 s) beginning at a start."""
    starts = sorted(starts)
    most = tail = 0
    for head, began in enumerate(starts):
        while tail < len(starts) and starts[tail] < began + 1.0:
            tail += 1
        most = max(most, tail - head)
    return most


def most_running(spans: list[tuple[float, float]]) -> int:
    """The most of ``spans`` (start, end) open at once; an end before a start at the same
    instant."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def measure(h: Harness, system: System, sizes: FlowSizes, limit: str) -> dict[str, Any]:
    h.server.reset()
    keys = 1 if limit == "rate" else FLOW_KEYS
    # Backlog enough for the whole span at twice the ideal rate (two nodes of a per-node
    # limit), and then half as much again.
    ideal = FLOW_RATE if limit == "rate" else FLOW_KEYS * FLOW_CONCURRENCY / FLOW_TASK_SECONDS
    backlog = int(ideal * 2 * sizes.seconds * 1.5) + 50
    stamps = h.stamp_file(f"{system.name}-flow-{limit}")
    ends = h.stamp_file(f"{system.name}-flow-{limit}-ends")
    produced = h.produce(system, JobSpec(backlog, "now", flow=limit, keys=keys), "fill")
    launched = time.time()
    procs = h.start(system, f"flow-{limit}", stamps, FLOW_WORKERS, end_file=ends)
    try:
        why = h.wait_stamps(stamps, 1, launched + sizes.startup_cap, procs)
        if why:
            raise ChildError(f"no task started: {why}")
        first = min(s.started for s in read_stamps(stamps))
        while time.time() < first + sizes.seconds:
            dead = [p for p in procs if not p.alive()]
            if dead:
                raise ChildError(f"{dead[0].role} exited: {dead[0].log_tail(3)}")
            time.sleep(0.1)
        stopped = time.time()
    finally:
        h.stop(procs)
    started = [s for s in read_stamps(stamps) if s.started < first + sizes.seconds]
    result: dict[str, Any] = {
        "limit": limit,
        "keys": keys,
        "backlog": backlog,
        "fill_s": produced["seconds"],
        "seconds": sizes.seconds,
        "startup_s": first - launched,
        "starts": len(started),
        "per_second": len(started) / sizes.seconds,
        "ideal_per_second": ideal,
    }
    if limit == "rate":
        result["most_in_one_second"] = most_in_a_second([s.started for s in started])
        result["bound"] = FLOW_RATE
    else:
        result |= concurrency_figures(started, read_stamps(ends), keys, stopped)
    return result


def concurrency_figures(
    started: list[Stamp], ended: list[Stamp], keys: int, stopped: float
) -> dict[str, Any]:
    """The most running at once, per key (the worst key) and in all; a task still running
    when the workers were killed counts as running until then."""
    end_of = {s.index: s.started for s in ended}
    by_key: dict[str, list[tuple[float, float]]] = {}
    for s in started:
        by_key.setdefault(key_of(s.index, keys), []).append(
            (s.started, end_of.get(s.index, stopped))
        )
    per_key = {key: most_running(spans) for key, spans in by_key.items()}
    return {
        "most_running_one_key": max(per_key.values(), default=0),
        "most_running_per_key": per_key,
        "most_running_all": most_running([span for spans in by_key.values() for span in spans]),
        "bound": FLOW_CONCURRENCY,
    }


def run(h: Harness, system: System, sizes: FlowSizes) -> dict[str, Any]:
    """Every limit the system has, measured once."""
    limits = [limit for limit in LIMITS if limit in supported(system)]
    return {limit: measure(h, system, sizes, limit) for limit in limits}


# --- the report ----------------------------------------------------------------------


def brief(result: dict[str, Any]) -> str:
    parts = []
    if rate := result.get("rate"):
        parts.append(f"rate {rate['per_second']:.1f}/s, most in 1 s {rate['most_in_one_second']}")
    if concurrency := result.get("concurrency"):
        parts.append(
            f"most running of one key {concurrency['most_running_one_key']}, "
            f"{concurrency['per_second']:.0f} tasks/s"
        )
    return "; ".join(parts)


def summarise(table: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per system: the median rate and throughput; the worst overshoot over the runs."""

    def median(values: list[float]) -> float | None:
        ordered = sorted(values)
        if not ordered:
            return None
        middle = len(ordered) // 2
        return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2

    summary: dict[str, Any] = {}
    for name, runs in table.items():
        rates = [r["rate"] for r in runs if "rate" in r]
        limits = [r["concurrency"] for r in runs if "concurrency" in r]
        summary[name] = {
            "runs": len(runs),
            "rate_per_second": median([r["per_second"] for r in rates]),
            "rate_most_in_one_second": max((r["most_in_one_second"] for r in rates), default=None),
            "concurrency_most_running_one_key": max(
                (r["most_running_one_key"] for r in limits), default=None
            ),
            "concurrency_per_second": median([r["per_second"] for r in limits]),
        }
    return summary


def markdown(document: dict[str, Any], measured_line: str) -> list[str]:
    """The report's section on the flow scenario."""
    summary = document["summary"].get("flow") or {}
    if not summary:
        return []
    ideal = FLOW_KEYS * FLOW_CONCURRENCY / FLOW_TASK_SECONDS
    spans = [m["seconds"] for runs in document["results"]["flow"].values() for r in runs
             for m in r.values()]  # fmt: skip
    lines = [
        "",
        f"## 7. Flow control: a rate limit of {FLOW_RATE}/s on one key, and at most "
        f"{FLOW_CONCURRENCY} running per key ({FLOW_KEYS} keys, tasks of "
        f"{FLOW_TASK_SECONDS * 1000:g} ms)",
        "",
        measured_line,
        "",
        f"{FLOW_WORKERS} worker processes per system, a backlog written before they start, "
        f"watched for {max(spans, default=0):g} s from the first start (opt-in: "
        "`run.py --scenario flow`). Start rate: starts in that span / its length. Most in "
        "1 s: the most starts in any one-second span (the overshoot; the limit allows "
        f"{FLOW_RATE}). Most running: the most tasks of one key running at once (from the "
        "handlers' start and end stamps; the limit allows "
        f"{FLOW_CONCURRENCY}), and tasks/s (at most {ideal:g}). Worst over the runs for the "
        "maxima, medians for the rates.",
        "",
        "| system | start rate /s | most in 1 s | most running, one key | tasks/s | how |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, row in summary.items():
        flow = document["systems"].get(name, {}).get("flow", {})
        how = "; ".join(f"{limit}: {text}" for limit, text in flow.items())
        lines.append(
            f"| {name} | {shown(row['rate_per_second'], '.1f')} | "
            f"{shown(row['rate_most_in_one_second'], 'd')} | "
            f"{shown(row['concurrency_most_running_one_key'], 'd')} | "
            f"{shown(row['concurrency_per_second'], ',.0f')} | {how or 'n/a'} |"
        )
    return lines


def shown(value: float | None, spec: str) -> str:
    return "n/a (no such limit)" if value is None else format(value, spec)
