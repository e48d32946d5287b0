"""``duetime limits``: read a queue's flow control (its limits, and what holds its due
tasks per limit key) and change it at run time, without restarting anything."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from duetime.cli.options import open_queue, queue_command
from duetime.cli.output import Table, stdout_console
from duetime.errors import InvalidOptionError
from duetime.flow import KeyLimits, Limits, Rate
from duetime.store.plans.flow_control import FlowState


@click.group()
def limits() -> None:
    """Flow control: show a queue's limits, or change them at run time."""


def _rate(text: str | None, burst: int) -> Rate | None:
    return None if text is None else Rate.parse(text, burst)


def _shown_rate(rate: Rate | None) -> str:
    return "-" if rate is None else str(rate)


def _key_row(limits: KeyLimits) -> tuple[str, str]:
    concurrency = "-" if limits.concurrency is None else str(limits.concurrency)
    return concurrency, _shown_rate(limits.rate)


@queue_command("show", group=limits)
@click.option("--keys", "most_keys", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON (times in epoch seconds).")
def show(queue: str, most_keys: int, as_json: bool, redis_url: str | None) -> None:
    """The queue's limits, and per limit key what waits, what runs, and until when a
    rate limit holds it (the first --keys keys, in key order)."""
    with open_queue(queue, redis_url) as client:
        declared = client.limits()
        state = client.flow(most_keys)
    if as_json:
        click.echo(json.dumps(_as_json(declared, state), indent=2))
        return
    console = stdout_console()
    if not state.enabled:
        console.print(f"{queue}: not under flow control (no limits, no priorities used)")
        return
    declared = declared or Limits()
    console.print(
        f"{queue}: cap {declared.cap or '-'}, rate {_shown_rate(declared.rate)}; each key: "
        f"concurrency {_key_row(declared.each_key)[0]}, rate {_key_row(declared.each_key)[1]}"
    )
    waiting = f"{state.due} waiting, {state.running} running"
    if state.queue_throttled_until_ms is not None:
        waiting += f"; the queue's rate holds all for {_until(state.queue_throttled_until_ms)}"
    console.print(waiting)
    # A key is whole (keys that share a prefix stay apart); its own limits give way first.
    table = Table(
        "key", "own limits", "waiting", "running", "rate wait", whole=("key",),
        fold=("own limits",),
    )  # fmt: skip
    for group in state.groups:
        own = declared.keys.get(group.key)
        table.add_row(
            group.key or "(no key)",
            "concurrency {}, rate {}".format(*_key_row(own)) if own else "-",
            str(group.due),
            str(group.running),
            "-" if group.throttled_until_ms is None else _until(group.throttled_until_ms),
        )
    console.print(table)


def _until(ms: float) -> str:
    return f"{max(0.0, ms / 1000 - time.time()):.3f}s"


def _as_json(declared: Limits | None, state: FlowState) -> dict[str, Any]:
    return {
        "enabled": state.enabled,
        "limits": None if declared is None else declared.fields(),
        "waiting": state.due,
        "running": state.running,
        "queue_throttled_until": _seconds(state.queue_throttled_until_ms),
        "keys": [
            {
                "key": group.key,
                "waiting": group.due,
                "running": group.running,
                "throttled_until": _seconds(group.throttled_until_ms),
                "has_turn": group.has_turn,
            }
            for group in state.groups
        ],
    }


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


@queue_command("set", group=limits, creates=True)
@click.option("--cap", type=int, help="Most tasks running at once in the queue, over all workers.")
@click.option("--rate", metavar="RATE", help="The queue's start rate: 100/s, 600/min, 5/2s.")
@click.option("--burst", type=int, default=1, show_default=True, help="Burst of --rate.")
@click.option("--each-concurrency", type=int, help="Most running at once for each limit key.")
@click.option("--each-rate", metavar="RATE", help="Start rate of each limit key.")
@click.option("--each-burst", type=int, default=1, show_default=True, help="Burst of --each-rate.")
def set_limits(
    queue: str,
    cap: int | None,
    rate: str | None,
    burst: int,
    each_concurrency: int | None,
    each_rate: str | None,
    each_burst: int,
    redis_url: str | None,
) -> None:
    """Replace the queue's limits with those given (keys' own limits are kept); it is
    under flow control from then on. Takes effect at once on every worker."""
    wanted = Limits(
        cap, _rate(rate, burst), KeyLimits(each_concurrency, _rate(each_rate, each_burst))
    )
    with open_queue(queue, redis_url) as client:
        client.set_queue_limits(wanted)
    click.echo(f"{queue}: limits set")


@queue_command("key", group=limits, creates=True)
@click.argument("key")
@click.option("--concurrency", type=int, help="Most of this key's tasks running at once.")
@click.option("--rate", metavar="RATE", help="This key's start rate: 10/s, 600/min.")
@click.option("--burst", type=int, default=1, show_default=True, help="Burst of --rate.")
@click.option("--clear", is_flag=True, help="Drop this key's own limits (the defaults apply).")
def key_limits(
    queue: str,
    key: str,
    concurrency: int | None,
    rate: str | None,
    burst: int,
    clear: bool,
    redis_url: str | None,
) -> None:
    """Set one limit key's own limits (over the defaults of each key), or --clear them."""
    if clear == (concurrency is not None or rate is not None):
        raise InvalidOptionError("give --concurrency and/or --rate, or --clear alone")
    own = None if clear else KeyLimits(concurrency, _rate(rate, burst))
    with open_queue(queue, redis_url) as client:
        client.set_key_limits(key, own)
    click.echo(f"{queue}: key {key!r}: " + ("own limits dropped" if clear else "limits set"))


@queue_command("clear", group=limits)
def clear_limits(queue: str, redis_url: str | None) -> None:
    """Drop every limit of the queue (it stays under flow control: priorities and turns
    between keys go on)."""
    with open_queue(queue, redis_url) as client:
        client.set_limits(Limits())
    click.echo(f"{queue}: limits cleared")


COMMANDS = (limits,)
