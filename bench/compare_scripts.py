"""Prove that a change to the Lua scripts changes no behaviour: run the scripts of a git
revision and the tree's side by side on many random states, and compare what they do.

Run from the project root (a git checkout; ``redis-server`` on PATH):

    .venv/bin/python bench/compare_scripts.py [--against REV] [--seed N] [--cases N]
        [--script NAME ...] [--verbose]

``--against`` names the revision whose scripts are the reference (default: the merge
base of HEAD and ``main``; once a branch is merged, name the commit before it, e.g.
``--against c364275``). Its scripts are read with ``git show REV:<path>`` and their
includes expanded the way that revision did (each ``-- @include`` line replaced by the
include; a revision whose includes include others is expanded recursively, each include
once). The tree's scripts are expanded by the tree's own ``duetime.store.plans.scripts``.

For each script, each case (``--cases``, default 300; the scripts of flow control and of
the ends of a lease get twice as many):

1. a random state of one queue is written to database 0 of a throwaway redis-server:
   tasks in every place (scheduled, delayed buckets, ready, a worker's list with its
   lease held, expired, missing or another worker's, dead, among the due), garbage
   envelopes, attempt counters and records, ids without a task, duplicate ids, early
   notes, cancel marks; flow control on or off with random limits (cap, rates,
   concurrency, per key and for the queue), turns, rate waits, rate state, stale slots
   and holds; the history on, off, tiny or damaged; stats, cron jobs, backfills;
2. a few random calls of the tree's scripts shape it further (schedule, promote, claim,
   ack, keyed calls...), as a queue's life would;
3. the call to compare is drawn from that state (its ids held, stale, repeated or
   unknown; leases fenced or not), and in about one case in six one or two of its keys
   are given the wrong type;
4. every key is copied to databases 1 and 2 (COPY), the revision's script runs on 1 and
   the tree's on 2 (same KEYS, same ARGV), and their replies and every key of the two
   databases (type, value, whether it has a TTL) are compared. An error reply is
   compared with the script's name and line (which any edit moves) taken out.

Deterministic by seed (``--seed``, default 42): a difference is printed with the case's
number, the call, and what differs; rerun one case with ``--script NAME --case N``.
Prints the cases per script and their replies by kind, and exits 1 on any difference
(2 when it cannot run). Not a pytest test: it needs the git history.
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import redis

# The tree's package first (not an installed one), then bench/ (for benchlib).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import Server  # a throwaway redis-server on a free port, persistence off

from duetime import codec
from duetime.store.plans import scripts as tree_scripts
from duetime.store.plans.history import packed_record
from duetime.store.plans.keys import QueueKeys, bucket_name
from duetime.store.plans.requests import packed_arguments

ROOT = Path(__file__).resolve().parents[1]
LUA_FOLDERS = ("src/duetime/store/plans/lua", "src/duetime/store/lua")
INCLUDE_LINE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)
#: What Redis 7 appends to an error raised in a script, and the line numbers in it.
SCRIPT_PLACE = re.compile(r" script: [0-9a-f]{40}, on @user_script:\d+\.?")
LINE = re.compile(r"user_script:\d+")

K = QueueKeys("q")
WORKERS = ("w1", "w2", "w3")
GROUPS = ("", "a", "b", "c")
NAMES = ("send", "report", "")
BASE_MS = 1_800_000_000_000
MOST_RANK = 999_999_999_999_999

Call = tuple[list[str], list[Any]]


def command(client: redis.Redis | redis.client.Pipeline, *args: Any) -> Any:
    """``client.execute_command(*args)``, typed: redis-py leaves that method unannotated."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


# --- the two sets of scripts


def git(*args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, encoding="utf-8"
    )
    if done.returncode:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def default_revision() -> str:
    base = git("merge-base", "HEAD", "main").strip()
    if base == git("rev-parse", "HEAD").strip():
        raise SystemExit(
            "HEAD is its own merge base with main: name the revision to compare with "
            "(--against REV, e.g. the commit before the change)"
        )
    return base


def revision_sources(revision: str) -> dict[str, str]:
    """The scripts of ``revision``, by name, their includes in place as it put them."""
    for folder in LUA_FOLDERS:
        listed = git("ls-tree", "--name-only", revision, f"{folder}/").split()
        names = [Path(path).stem for path in listed if path.endswith(".lua")]
        if names:
            break
    else:
        raise SystemExit(f"no Lua scripts found at {revision}")

    def include(name: str) -> str:
        return git("show", f"{revision}:{folder}/include/{name}.lua")

    def recursive(source: str, placed: set[str]) -> str:
        def place(match: re.Match[str]) -> str:
            if match[1] in placed:
                return ""
            placed.add(match[1])
            return recursive(include(match[1]), placed).rstrip("\n")

        return INCLUDE_LINE.sub(place, source)

    sources = {}
    for name in names:
        source = git("show", f"{revision}:{folder}/{name}.lua")
        flat = INCLUDE_LINE.sub(lambda match: include(match[1]).rstrip("\n"), source)
        sources[name] = recursive(source, set()) if INCLUDE_LINE.search(flat) else flat
    return sources


def tree_sources() -> dict[str, str]:
    """The tree's scripts, by name, as the tree's scripts.py expands them."""
    folder = Path(tree_scripts.__file__).parent / "lua"
    if ROOT not in folder.resolve().parents:
        raise SystemExit(f"duetime was imported from {folder}, not from this tree")
    return {
        path.stem: tree_scripts.expanded(path.read_text("utf-8"), path.stem)
        for path in sorted(folder.glob("*.lua"))
    }


def commands_of(source: str) -> set[str]:
    return set(re.findall(r"redis\.p?call\('(\w+)'", source))


# --- a random state


def rank_text(run_at: float, priority: int) -> str:
    return f"{min(MOST_RANK, max(0, int(run_at - 1000 * priority))):015d}"


class Data:
    """Keys to write, by type."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, Any]] = {}
        self.zsets: dict[str, dict[str, Any]] = {}
        self.lists: dict[str, list[Any]] = {}
        self.strings: dict[str, Any] = {}
        self.ttls: dict[str, int] = {}

    def hset(self, key: str, name: str, value: Any) -> None:
        self.hashes.setdefault(key, {})[name] = value

    def zadd(self, key: str, member: str, score: Any) -> None:
        self.zsets.setdefault(key, {})[member] = score

    def rpush(self, key: str, *items: Any) -> None:
        self.lists.setdefault(key, []).extend(items)

    def write(self, client: redis.Redis) -> None:
        pipe = client.pipeline(transaction=False)
        self.hashes = {key: fields for key, fields in self.hashes.items() if fields}
        self.zsets = {key: members for key, members in self.zsets.items() if members}
        for key, fields in self.hashes.items():
            command(pipe, "HSET", key, *(x for pair in fields.items() for x in pair))
        for key, members in self.zsets.items():
            command(pipe, "ZADD", key, *(x for m, s in members.items() for x in (s, m)))
        for key, items in self.lists.items():
            command(pipe, "RPUSH", key, *items)
        for key, value in self.strings.items():
            command(pipe, "SET", key, value)
        for key, ttl in self.ttls.items():
            command(pipe, "PEXPIRE", key, ttl)
        pipe.execute()


def envelope(rng: random.Random, name: str, run_at: float) -> bytes:
    if rng.random() < 0.05:
        return rng.choice((b"junk", b"\x93\x01\xa1x", b""))  # not an envelope duetime wrote
    return codec.encode_envelope(
        codec.Envelope(
            task=name,
            data={"n": rng.randrange(100)},
            run_at_ms=run_at,
            max_attempts=rng.choice((1, 3, 5)),
            timeout_ms=30_000,
            result_ttl_ms=rng.choice((0, 0, 60_000)),
            expires_after_ms=rng.choice((0, 0, 0, 5_000)),
            snoozes=rng.choice((0, 0, 0, 1, 4)),
        )
    )


def a_rate(rng: random.Random) -> str:
    if rng.random() < 0.1:
        return rng.choice(("none", "0|1000|1", "junk"))
    count = rng.choice((1, 2, 5, 20, 400, 2000))
    return f"{count}|{rng.choice((1000, 500, 60_000))}|{rng.choice((1, 1, 2, 5))}"


def limit_fields(rng: random.Random) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if rng.random() < 0.4:
        fields["cap"] = rng.choice((1, 2, 3, 6, "none"))
    if rng.random() < 0.3:
        fields["rate"] = a_rate(rng)
    if rng.random() < 0.4:
        fields["each_concurrency"] = rng.choice((1, 2, 3, "none"))
    if rng.random() < 0.3:
        fields["each_rate"] = a_rate(rng)
    for group in GROUPS[1:]:
        if rng.random() < 0.25:
            fields[f"concurrency:{group}"] = rng.choice((1, 2, "none"))
        if rng.random() < 0.2:
            fields[f"rate:{group}"] = a_rate(rng)
    return fields


def build_world(rng: random.Random, now: int) -> Data:
    d = Data()
    flow = rng.random() < 0.6
    generation = rng.choice((0, 0, 1, 2))
    if generation or rng.random() < 0.5:
        d.hset(K.delayed_layout, "generation", "x" if rng.random() < 0.03 else generation)
    bucketed = 0
    earliest: dict[str, int] = {}
    entries: list[bytes] = []  # the history's, oldest first
    newest_history: dict[str, int] = {}
    for n in range(rng.randint(0, 12)):
        task_id = f"t{n}"
        name = rng.choice(NAMES)
        places = ("scheduled", "delayed", "ready", "active", "dead", "due", "gone", "unknown")
        place = rng.choices(places, (3, 2, 3, 5, 1, 4 if flow else 0, 1, 1))[0]
        run_at: float = now + rng.randint(-5000, 5000) + rng.choice((0, 0, 0, 0.5))
        if place != "unknown":
            d.hset(K.tasks, task_id, envelope(rng, name, run_at))
        group = rng.choice(GROUPS)
        priority = rng.choice((-1, 0, 0, 0, 1, 2))
        rank = rank_text(run_at, priority)
        ranked = place == "due" or (place in ("ready", "active") and rng.random() < 0.4)
        if flow or rng.random() < 0.2:
            record = f"{priority}|{rng.choice((1, 1, 1, 2, 5))}|{rank if ranked else ''}|{group}"
            d.hset(K.flow_records, task_id, "bad" if rng.random() < 0.03 else record)
        if place == "scheduled":
            d.zadd(K.scheduled, task_id, run_at)
        elif place == "delayed":
            g = rng.randint(0, generation)
            bucket = bucket_name(task_id, g)
            us = int(run_at * 1000)
            d.zadd(K.delayed_bucket(bucket), task_id, us)
            earliest[bucket] = min(earliest.get(bucket, us), us)
            bucketed += 1
        elif place == "ready" or (place == "unknown" and rng.random() < 0.5):
            d.rpush(K.ready, *([task_id] * rng.choice((1, 1, 1, 1, 2))))
        elif place in ("active", "unknown"):
            worker = rng.choice(WORKERS)
            d.rpush(K.active(worker), task_id)
            member = f"{worker}|{task_id}"
            if rng.random() < 0.85:
                d.zadd(K.leases, member, now + rng.randint(-3000, 3000))
                if flow and rng.random() < 0.85:
                    d.zadd(K.running, f"{group}\0{member}", 0)
            elif rng.random() < 0.3:
                d.zadd(K.leases, f"{rng.choice(WORKERS)}|{task_id}", now + 1000)
            if rng.random() < 0.9:
                d.hset(K.attempts, task_id, "x" if rng.random() < 0.03 else rng.randint(1, 3))
            if rng.random() < 0.15:
                d.hset(K.cancelling, task_id, now - 100)
        elif place == "dead":
            d.zadd(K.dead, task_id, now - rng.randint(0, 10**6))
            d.hset(K.errors, task_id, b"\x92\xa3err\x01")
            d.hset(K.attempts, task_id, rng.randint(1, 5))
        elif place == "due":
            d.zadd(K.due, f"{group}\0{rank}\0{task_id}", 0)
        if place != "dead" and rng.random() < 0.15:
            d.hset(K.early, task_id, "zz" if rng.random() < 0.05 else run_at)
        if place in ("scheduled", "delayed") and rng.random() < 0.1:
            d.hset(K.errors, task_id, b"\x92\xa3err\x01")
            d.hset(K.attempts, task_id, 1)
        if rng.random() < 0.1:
            d.rpush(K.result(task_id), b"\x96\xc3\x01\x00\x00\x01\xc0")
            d.ttls[K.result(task_id)] = 60_000
        if rng.random() < 0.3:
            previous = newest_history.get(task_id)
            entries.append(
                (b"" if previous is None else str(previous).encode())
                + b"|"
                + packed_record(task_id, name, 1, now - 1000, "w1", 10, 5)
            )
            newest_history[task_id] = len(entries)
    for bucket, us in earliest.items():
        d.zadd(K.delayed, bucket, us)
    if bucketed:
        d.hset(K.delayed_layout, "tasks", bucketed if rng.random() > 0.05 else "x")
    if rng.random() < 0.05:
        d.zadd(K.leases, "w2|ghost", now - 10)
    if rng.random() < 0.05:
        d.zadd(K.leases, "nobar", now - 10)
    if flow:
        d.hset(K.limits, "since", now - 1000)
        for name, value in limit_fields(rng).items():
            d.hset(K.limits, name, value)
    if flow or rng.random() < 0.1:
        for turn, group in enumerate(rng.sample(GROUPS, rng.randint(0, 4)), 1):
            d.zadd(K.turns, group, turn)
        for group in rng.sample((*GROUPS, "\0"), rng.randint(0, 3)):
            d.zadd(K.throttled, group, now + rng.randint(-2000, 2000))
        for group in rng.sample((*GROUPS, "\0"), rng.randint(0, 3)):
            d.zadd(K.rate_state, group, now + rng.randint(-70_000, 3000))
        for group in rng.sample((*GROUPS, "\0"), rng.randint(0, 3)):
            d.hset(K.flow_holds, group, "slot" if rng.random() < 0.4 else now - 500)
        if rng.random() < 0.15:
            d.zadd(K.running, f"{rng.choice(GROUPS)}\0w3|stale", 0)
    history(rng, d, entries, newest_history)
    if rng.random() < 0.7:
        d.hset(K.stats, "scheduled", rng.randint(0, 50))
        d.hset(K.stats, "failed", "x" if rng.random() < 0.1 else rng.randint(0, 5))
    if rng.random() < 0.3:
        d.hset(K.minutes, f"{now // 60000}:late_max_us", rng.choice((5, 10**6, "x")))
    if rng.random() < 0.3:
        d.rpush(K.wake, 1)
    for worker in WORKERS:
        if rng.random() < 0.8:
            d.zadd(K.workers, worker, now - rng.choice((0, 2000, 60_000, 10**6)))
        if rng.random() < 0.1:
            d.zadd(K.reaped, worker, now + 5000)
    if rng.random() < 0.08:
        d.strings[K.paused] = 1
    if rng.random() < 0.1:
        d.rpush(K.gone_workers, msgpack.packb(["w9", now - 9, now - 5, 0, []]))
    cron_world(rng, d, now)
    return d


def history(rng: random.Random, d: Data, entries: list[bytes], newest: dict[str, int]) -> None:
    kind = rng.random()
    if kind < 0.35:
        return  # none yet: the default size
    if kind < 0.8:
        d.hset(K.history_state, "size", rng.choice((1, 2, 4, 1000)))
        d.hset(K.history_state, "seq", len(entries))
    elif kind < 0.9:
        d.hset(K.history_state, "size", 0)
    else:
        d.hset(K.history_state, "seq", "x")
    if entries:
        d.rpush(K.history, *reversed(entries))
        for task_id, number in newest.items():
            d.zadd(K.history_tasks, task_id, number)


def cron_world(rng: random.Random, d: Data, now: int) -> None:
    for n in range(rng.randint(0, 3)):
        name = f"job{n}"
        d.hset(K.cron, name, f"definition {rng.randint(0, 1)}")
        if rng.random() < 0.7:
            d.zadd(K.cron_next, name, now + rng.randint(-5000, 5000))
        tick = now - 60_000 * rng.randint(1, 3)
        if rng.random() < 0.5:
            last = f"cron:{name}:{tick}"
            d.hset(K.cron_last, name, last)
            if rng.random() < 0.4:
                d.hset(K.tasks, last, envelope(rng, "tick", tick))
                d.rpush(K.ready, last)
            if rng.random() < 0.2:
                d.zadd(K.dead, last, now - 10)
        if rng.random() < 0.1:
            d.hset(K.cron_held, name, now)
        if rng.random() < 0.3:
            judge = f"cron:{name}:{tick}" if rng.random() < 0.5 else ""
            state = f"{rng.randint(0, 3)}|{rng.randint(0, 2)}|{rng.randint(0, 1)}|{judge}"
            d.hset(K.cron_state, name, state)
        if rng.random() < 0.4:
            fired = rng.choice(
                (f"{tick - 60_000}|", f"|{tick - 600_000}:{tick - 300_000}", "|", "junk")
            )
            d.hset(K.cron_fired, name, fired)
        if rng.random() < 0.3:
            start = tick - 600_000
            d.hset(K.cron_backfill, name, backfill_record(rng, start, tick))
            d.zadd(K.cron_backfill_due, name, now - rng.randint(0, 1000))


def backfill_record(rng: random.Random, start: int, tick: int) -> str:
    head = f"{start}|{tick}|60000|{rng.choice((start, tick, -1))}|{rng.randint(0, 3)}|10"
    return head if rng.random() < 0.3 else f"{head}|0|0|{start}:{start + 60_000}"


# --- drawing a call from a state


@dataclass
class Case:
    rng: random.Random
    client: redis.Redis  # database 0
    now: int
    #: The task ids of the tasks hash, read once per call drawn.
    _tasks: list[str] | None = None

    def text(self, raw: Iterable[bytes | str]) -> list[str]:
        return [
            item if isinstance(item, str) else item.decode("utf-8", "surrogateescape")
            for item in raw
        ]

    def listed(self, key: str) -> list[str]:
        if self.client.type(key) != b"list":
            return []
        return self.text(self.client.lrange(key, 0, -1))

    def members(self, key: str) -> list[str]:
        if self.client.type(key) != b"zset":
            return []
        return self.text(command(self.client, "ZRANGE", key, 0, -1))

    def fields(self, key: str) -> list[str]:
        if self.client.type(key) != b"hash":
            return []
        return self.text(self.client.hkeys(key))

    def field(self, key: str, name: str) -> bytes | None:
        if self.client.type(key) != b"hash":
            return None
        value = self.client.hget(key, name)
        return value.encode() if isinstance(value, str) else value

    def score(self, key: str, member: str) -> float | None:
        if self.client.type(key) != b"zset":
            return None
        found: float | None = self.client.zscore(key, member)
        return found

    def tasks(self) -> list[str]:
        if self._tasks is None:
            self._tasks = self.fields(K.tasks)
        return self._tasks

    def pick(self, preferred: Sequence[str]) -> str:
        """An id: mostly one of ``preferred``, else any task, else one no task has."""
        roll = self.rng.random()
        if preferred and roll < 0.75:
            return self.rng.choice(list(preferred))
        if self.tasks() and roll < 0.9:
            return self.rng.choice(self.tasks())
        return self.rng.choice(("nope", f"new{self.rng.randrange(1000)}"))

    def worker(self) -> str:
        return self.rng.choice(WORKERS)

    def attempt_of(self, task_id: str) -> int:
        stored = self.field(K.attempts, task_id)
        attempt = int(stored) if stored and stored.isdigit() else 1
        return attempt + self.rng.choice((0, 0, 0, 0, 1, -1))

    def generation(self) -> int:
        stored = self.field(K.delayed_layout, "generation")
        current = int(stored) if stored and stored.isdigit() else 0
        return current if self.rng.random() < 0.85 else self.rng.choice((-1, current + 1))

    def record(self) -> str:
        if self.rng.random() < 0.6:
            return ""
        priority = self.rng.choice((-1, 0, 1, 2))
        return f"{priority}|{self.rng.choice((1, 1, 2))}||{self.rng.choice(GROUPS)}"

    def new_envelope(self, run_at: float) -> bytes:
        return envelope(self.rng, self.rng.choice(NAMES), run_at)


SCHEDULE_KEYS = [
    K.tasks, K.scheduled, K.ready, K.wake, K.stats, K.delayed, K.delayed_layout, K.limits,
    K.flow_records, K.due, K.turns, K.throttled, K.rate_state, K.running, K.leases,
    K.flow_holds,
]  # fmt: skip


def later_run_at(c: Case) -> float:
    roll = c.rng.random()
    if roll < 0.3:
        return c.now - c.rng.randint(0, 2000)  # due now
    if roll < 0.35:
        return 2**53 / 1000 + 10  # past what a bucket keeps in µs
    return c.now + c.rng.randint(1, 20_000) + c.rng.choice((0, 0, 0.25))


def schedule_task(c: Case) -> Call:
    task_id = c.pick([]) if c.rng.random() < 0.3 else f"s{c.rng.randrange(10**6)}"
    run_at = later_run_at(c)
    generation = max(0, c.generation())
    bucket = K.delayed_bucket(bucket_name(task_id, generation))
    us = str(int(run_at * 1000))
    args = [c.now, task_id, run_at, c.new_envelope(run_at), us, generation, c.record()]
    return [*SCHEDULE_KEYS, bucket], args


def schedule_tasks(c: Case) -> Call:
    keys = list(SCHEDULE_KEYS)
    generation = max(0, c.generation())
    where: dict[str, int] = {}
    flat: list[Any] = []
    for _ in range(c.rng.randint(1, 6)):
        task_id = c.pick([]) if c.rng.random() < 0.2 else f"s{c.rng.randrange(10**6)}"
        run_at = later_run_at(c)
        name = bucket_name(task_id, generation)
        if name not in where:
            keys.append(K.delayed_bucket(name))
            where[name] = len(keys)
        us = str(int(run_at * 1000))
        flat += (task_id, run_at, c.new_envelope(run_at), where[name], us, c.record())
    return keys, [c.now, packed_arguments(flat), generation + c.rng.choice((0, 0, 0, 1))]


def promote_due(c: Case) -> Call:
    fixed = [
        K.scheduled, K.ready, K.leases, K.stats, K.workers, K.cron_next, K.early, K.reaped,
        K.delayed, K.delayed_layout, *K.flow_keys, K.wake, K.cron_backfill_due, K.flow_holds,
    ]  # fmt: skip
    buckets = [K.delayed_bucket(name) for name in c.members(K.delayed) if c.rng.random() < 0.8]
    if c.rng.random() < 0.1:
        buckets.append(K.delayed_bucket("0:0"))
    upto = c.now + c.rng.choice((0, 0, 5, 50, 2000))
    args: list[Any] = [c.now, upto, c.rng.choice((1, 2, 5, 50, 1000))]
    if c.rng.random() < 0.9:
        args.append(upto + c.rng.choice((0, 0, 1000, 10_000)))
    return [*fixed, *buckets], args


def claim_tasks(c: Case) -> Call:
    worker = c.worker()
    taken: list[str] = []
    if c.rng.random() < 0.5 and c.client.type(K.ready) in (b"list", b"none"):
        for _ in range(c.rng.randint(1, 3)):  # what the worker's BLMOVE moved
            moved = c.client.lmove(K.ready, K.active(worker), "LEFT", "RIGHT")
            if moved is None:
                break
            taken.extend(c.text([moved]))
    if c.rng.random() < 0.1:
        taken.append(c.pick(c.listed(K.active(worker))))  # reaped meanwhile, or another's
    keys = [
        K.ready, K.active(worker), K.leases, K.attempts, K.tasks, K.workers, K.early, K.paused,
        K.stats, *K.flow_keys, K.wake, K.flow_holds,
    ]  # fmt: skip
    most = c.rng.choice((0, 1, 1, 2, 5, 10))
    return keys, [c.now, c.now + 30_000, worker, most, *taken]


def ack_tasks(c: Case) -> Call:
    worker = c.worker()
    listed = c.listed(K.active(worker))
    keys = [
        K.active(worker), K.leases, K.attempts, K.tasks, K.errors, K.stats, K.minutes,
        *K.flow_keys, K.wake, K.ready, *K.history_keys, K.cancelling, K.flow_holds,
    ]  # fmt: skip
    flat: list[Any] = []
    helds = []
    chosen = [c.pick(listed) for _ in range(c.rng.randint(1, 4))]
    if c.rng.random() < 0.1:
        chosen.append(chosen[0])  # the same outcome twice
    for task_id in chosen:
        attempt = c.attempt_of(task_id)
        ttl = c.rng.choice((0, 0, 60_000))
        lateness = c.rng.randint(-5, 5000)
        record = packed_record(task_id, "send", attempt, c.now, worker, 100, lateness)
        flat += (task_id, attempt, ttl, b"\x96\xc3\x01", lateness, record)
        helds.append(c.rng.choice((0, 0, 1500)))
        if ttl > 0:
            keys.append(K.result(task_id))
    args: list[Any] = [c.now, worker, packed_arguments(flat)]
    if any(helds) or c.rng.random() < 0.1:
        args.append(packed_arguments(helds))
    return keys, args


def fail_task(c: Case) -> Call:
    worker = c.worker()
    task_id = c.pick(c.listed(K.active(worker)))
    keys = [
        K.active(worker), K.leases, K.attempts, K.errors, K.scheduled, K.dead, K.wake, K.stats,
        K.result(task_id), K.minutes, K.early, *K.flow_keys, K.ready, K.tasks, *K.history_keys,
        K.cancelling,
    ]  # fmt: skip
    retry = -1 if c.rng.random() < 0.3 else c.now + c.rng.choice((1, 1000, 60_000))
    ran = (c.rng.randint(0, 10**6), c.rng.randint(-10, 5000)) if c.rng.random() < 0.8 else (-1, -1)
    args = [
        c.now, worker, task_id, str(c.attempt_of(task_id)), b"\x92\xa3err\x02", retry,
        c.rng.choice((0, 0, 60_000)), b"\x96\xc2\x01", *ran, "boom",
        "expired" if c.rng.random() < 0.1 else "",
    ]  # fmt: skip
    return keys, args


def snooze_task(c: Case) -> Call:
    worker = c.worker()
    task_id = c.pick(c.listed(K.active(worker)))
    keys = [
        K.active(worker), K.leases, K.attempts, K.scheduled, K.wake, K.stats, K.early,
        *K.flow_keys, K.ready, K.tasks, *K.history_keys, K.cancelling, K.errors,
    ]  # fmt: skip
    args = [
        c.now, worker, task_id, str(c.attempt_of(task_id)), c.now + c.rng.choice((1, 500, 9000)),
        c.rng.choice(("0", "1")), c.rng.randint(0, 10**6), c.rng.randint(-10, 5000),
    ]  # fmt: skip
    return keys, args


def reap_expired_leases(c: Case) -> Call:
    members = c.members(K.leases)
    chosen = [m for m in members if c.rng.random() < 0.7]
    if c.rng.random() < 0.1:
        chosen.append("w1|nolease")
    if chosen and c.rng.random() < 0.1:
        chosen.append(chosen[0])
    keys = [
        K.leases, K.scheduled, K.wake, K.stats, K.tasks, K.early, *K.flow_keys, K.ready,
        K.attempts, *K.history_keys, K.cancelling, K.errors,
    ]  # fmt: skip
    holders: dict[str, int] = {}
    args: list[Any] = [c.now]
    for member in chosen:
        worker = member.partition("|")[0]
        index = holders.setdefault(K.active(worker), 21 + len(holders))
        args += (member, index)
    return [*keys, *holders], args


def reap_worker(c: Case) -> Call:
    worker = c.worker()
    keys = [
        K.workers, K.active(worker), K.leases, K.scheduled, K.wake, K.stats, K.reaped, K.tasks,
        K.early, *K.flow_keys, K.ready, K.attempts, *K.history_keys, K.cancelling, K.errors,
        K.gone_workers,
    ]  # fmt: skip
    stale_before = c.now - c.rng.choice((0, 10_000, 100_000))
    return keys, [c.now, worker, stale_before, c.rng.choice((-1, c.now + 5000))]


def release_worker(c: Case) -> Call:
    worker = c.worker()
    keys = [
        K.workers, K.active(worker), K.leases, K.attempts, K.ready, K.stats, K.reaped, K.tasks,
        K.early, *K.flow_keys, K.wake, K.cancelling, K.errors, *K.history_keys,
    ]  # fmt: skip
    return keys, [worker, c.now + 5000, c.rng.choice((0, 0, 2)), c.now]


def give_back_task(c: Case) -> Call:
    worker = c.worker()
    keys = [
        K.active(worker), K.ready, K.tasks, K.stats, K.cancelling, K.attempts, K.errors,
        K.early, K.flow_records, *K.history_keys,
    ]  # fmt: skip
    return keys, [c.pick(c.listed(K.active(worker))), c.now, worker]


def heartbeat(c: Case) -> Call:
    worker = c.worker()
    keys = [K.workers, K.leases, K.attempts, K.active(worker), K.stats, K.cancelling]
    args: list[Any] = [c.now, c.now + 30_000, worker, c.rng.choice((0, 0, 3))]
    for task_id in {c.pick(c.listed(K.active(worker))) for _ in range(c.rng.randint(0, 3))}:
        args += (task_id, c.attempt_of(task_id))
    return keys, args


def buckets_of(task_id: str, generation: int) -> list[str]:
    return [K.delayed_bucket(bucket_name(task_id, g)) for g in range(generation + 1)]


def cancel_task(c: Case) -> Call:
    task_id = c.pick(c.tasks())
    generation = c.generation()
    keys = [
        K.tasks, K.scheduled, K.ready, K.dead, K.attempts, K.errors, K.stats, K.early,
        K.delayed, K.delayed_layout, K.flow_records, K.due, *K.history_keys, K.cancelling,
        K.wake, *buckets_of(task_id, generation),
    ]  # fmt: skip
    flags = (c.rng.choice(("0", "1")), c.rng.choice(("0", "1", "1")))
    return keys, [task_id, generation, c.now, *flags, K.cancel_channel]


def reschedule_task(c: Case) -> Call:
    task_id = c.pick(c.tasks())
    generation = c.generation()
    keys = [
        K.tasks, K.scheduled, K.ready, K.dead, K.wake, K.early, K.delayed, K.delayed_layout,
        K.flow_records, K.due, K.limits, *buckets_of(task_id, generation),
    ]  # fmt: skip
    current = c.field(K.tasks, task_id) or b""
    if c.rng.random() < 0.1:
        current = b"changed"
    due = c.now if c.rng.random() < 0.3 else later_run_at(c)
    due = max(due, c.now)
    args = [c.now, task_id, due, current, c.new_envelope(due), generation, str(int(due * 1000))]
    return keys, args


def task_status(c: Case) -> Call:
    task_id = c.pick(c.tasks())
    generation = c.generation()
    keys = [
        K.tasks, K.scheduled, K.ready, K.dead, K.attempts, K.errors, K.result(task_id),
        K.delayed_layout, K.flow_records, K.due, K.cancelling, *buckets_of(task_id, generation),
    ]  # fmt: skip
    return keys, [task_id, generation]


def requeue_dead(c: Case) -> Call:
    keys = [K.dead, K.attempts, K.errors, K.ready, K.stats, K.early, K.tasks]
    dead = c.members(K.dead)
    return keys, [c.now, *(c.pick(dead) for _ in range(c.rng.randint(0, 3)))]


def purge_dead(c: Case) -> Call:
    keys = [K.dead, K.tasks, K.attempts, K.errors, K.flow_records]
    dead = c.members(K.dead)
    before = c.rng.choice((-1, c.now - 500_000, c.now))
    keep = c.rng.choice((-1, -1, 0, 1, 3))
    ids = [c.pick(dead) for _ in range(c.rng.randint(0, 3))]
    return keys, [before, keep, c.rng.choice((1, 2, 1000)), *ids]


def set_limits(c: Case) -> Call:
    keys = [*K.flow_keys, K.leases, K.wake, K.ready]
    fields: list[Any] = []
    for name, value in limit_fields(c.rng).items():
        fields += (name, "" if c.rng.random() < 0.15 else value)
    return keys, [c.now, c.rng.choice(("replace", "queue", "update")), *fields]


FIELDS = ("k1", "k2")


def keyed_head(c: Case, mode: str) -> list[Any]:
    run_at = c.now + c.rng.choice((0, 0, 10, 500, 5000))
    head, limits = codec.envelope_parts(
        c.rng.choice(NAMES), c.rng.choice((1, 5)), 300_000, c.rng.choice((0, 60_000)),
        c.rng.choice((0, 0, 5000)),
    )  # fmt: skip
    new_id = c.pick([]) if c.rng.random() < 0.1 else f"k{c.rng.randrange(10**6)}"
    data = msgpack.packb({"n": c.rng.randrange(100)})
    return [c.now, f"{mode}:{c.rng.choice(FIELDS)}", new_id, run_at, head, data, limits, c.record()]


def debounce_task(c: Case) -> Call:
    args = keyed_head(c, "d")
    args += (
        c.rng.choice((1, 100, 2000)), c.rng.choice((0, 0, 3000)), c.rng.choice(("last", "all")),
        c.rng.choice((2, 3, 100)), c.rng.choice((20, 10_000)),
    )  # fmt: skip
    return list(K.keyed_keys), args


def throttle_task(c: Case) -> Call:
    args = keyed_head(c, "t")
    args += (c.rng.choice((100, 2000, 10_000)), c.rng.choice(("0", "1")))
    return list(K.keyed_keys), args


def schedule_unique(c: Case) -> Call:
    args = keyed_head(c, "u")
    args.append(c.rng.choice(("started", "finished")))
    return list(K.keyed_keys), args


def sweep_keyed(c: Case) -> Call:
    keys = [K.keyed, K.keyed_expiry, K.keyed_tasks, K.tasks, K.attempts, K.dead]
    upto = c.now + c.rng.choice((-1000, 0, 10_000))
    return keys, [c.now, c.rng.choice((1, 2, 100)), 5000, upto]


def keyed_status(c: Case) -> Call:
    return [K.keyed_tasks, K.keyed], [c.pick(c.fields(K.keyed_tasks))]


def cron_name(c: Case, among: str | None = None) -> str:
    """A job's name: mostly one ``among`` holds (a ZSET's member or a HASH's field)."""
    found = (c.members(among) or c.fields(among)) if among else []
    if found and c.rng.random() < 0.8:
        return c.rng.choice(found)
    return c.rng.choice(("job0", "job1", "job2", "nojob"))


def declare_cron(c: Case) -> Call:
    keys = [K.cron, K.cron_next, K.wake, K.cron_state, K.cron_last, K.cron_fired]
    args: list[Any] = []
    for _ in range(c.rng.randint(1, 3)):
        args += (
            cron_name(c),
            f"definition {c.rng.randint(0, 1)}",
            c.now + c.rng.randint(-10, 9000),
        )
    return keys, args


def set_cron_next(c: Case) -> Call:
    keys = [K.cron, K.cron_next, K.cron_held, K.wake, K.cron_state, K.cron_last, K.cron_fired]
    return keys, [cron_name(c), c.rng.choice((-1, c.now + 1000, c.now - 5))]


def remove_cron(c: Case) -> Call:
    keys = [
        K.cron, K.cron_next, K.cron_last, K.cron_held, K.cron_state, K.cron_backfill,
        K.cron_backfill_due, K.cron_fired,
    ]  # fmt: skip
    return keys, [cron_name(c)]


def due_cron(c: Case) -> Call:
    return [K.cron_next, K.cron, K.cron_held], [c.now, c.rng.choice((1, 10))]


def a_tick(c: Case, name: str, tick: int) -> list[Any]:
    task_id = f"cron:{name}:{tick}"
    record = c.record()
    return [task_id, tick, envelope(c.rng, "tick", tick), record]


def fire_cron(c: Case) -> Call:
    keys = [
        K.cron_next, K.cron_last, K.cron_held, K.tasks, K.ready, K.stats, K.limits,
        K.flow_records, K.scheduled, K.wake, K.cron_state, K.dead, K.cron_fired,
    ]  # fmt: skip
    jobs = []
    for _ in range(c.rng.randint(1, 3)):
        name = cron_name(c, K.cron_next)
        score = c.score(K.cron_next, name)
        read = score if score is not None and c.rng.random() < 0.85 else c.now
        overlap = c.rng.choice(("allow", "skip", "delay"))
        job: list[Any] = [
            name, read, c.rng.choice((-1, c.now + 60_000)), overlap, c.now + 1000, c.now,
            c.rng.choice((0, 0, 2)), c.rng.choice((0, 0, 2)), c.rng.choice((0, 0, 1)),
            c.rng.choice(("0", "1")),
        ]  # fmt: skip
        for n in range(c.rng.randint(0, 2)):
            job += a_tick(c, name, c.now - 60_000 * n)
        jobs.append(job)
    return keys, [packed_arguments(jobs)]


def start_backfill(c: Case) -> Call:
    name = cron_name(c, K.cron)
    read = c.field(K.cron_backfill, name) or b""
    if c.rng.random() < 0.1:
        read = b"stale"
    record = backfill_record(c.rng, c.now - 600_000, c.now - 60_000)
    return [K.cron, K.cron_backfill, K.cron_backfill_due, K.wake], [
        name, read, record, c.now, c.rng.choice(("0", "1")),
    ]  # fmt: skip


def fire_backfill(c: Case) -> Call:
    keys = [
        K.cron_backfill_due, K.cron_backfill, K.cron_last, K.tasks, K.ready, K.stats, K.limits,
        K.flow_records, K.scheduled, K.wake, K.cron_fired,
    ]  # fmt: skip
    rows = []
    for _ in range(c.rng.randint(1, 2)):
        name = cron_name(c, K.cron_backfill_due)
        due = c.score(K.cron_backfill_due, name)
        record = c.field(K.cron_backfill, name)
        tick = c.now - 60_000 * c.rng.randint(1, 9)
        rows.append([
            name, c.now if due is None else due, record or b"", c.rng.choice((-1, tick + 60_000)),
            c.now + 10, c.rng.choice(("allow", "skip", "delay")), c.now + 1000,
            *a_tick(c, name, tick),
        ])  # fmt: skip
    return keys, [packed_arguments(rows)]


def set_history(c: Case) -> Call:
    return list(K.history_keys), [c.rng.choice((-1, 0, 1, 3, 1000))]


def history_page(c: Case) -> Call:
    return [K.history_state, K.history], [c.rng.choice((0, 0, 1, 3, 50)), c.rng.choice((1, 5, 100))]


def task_history(c: Case) -> Call:
    return list(K.history_keys), [c.pick(c.tasks()), c.rng.choice((1, 5, 100))]


@dataclass(frozen=True)
class Spec:
    draw: Callable[[Case], Call]
    #: Scripts whose calls shape the state before this one's (a queue's life so far).
    warm: tuple[str, ...]
    weight: int = 1


LIFE = (
    "schedule_tasks", "schedule_task", "promote_due", "claim_tasks", "claim_tasks",
    "ack_tasks", "fail_task", "snooze_task", "reap_expired_leases", "heartbeat",
    "set_limits", "cancel_task",
)  # fmt: skip
KEYED = ("debounce_task", "throttle_task", "schedule_unique", "promote_due", "claim_tasks")
CRON = ("declare_cron", "fire_cron", "set_cron_next", "start_backfill", "fire_backfill")

SPECS: dict[str, Spec] = {
    "schedule_tasks": Spec(schedule_tasks, LIFE, 2),
    "schedule_task": Spec(schedule_task, LIFE, 2),
    "promote_due": Spec(promote_due, LIFE, 2),
    "claim_tasks": Spec(claim_tasks, LIFE, 2),
    "heartbeat": Spec(heartbeat, LIFE),
    "ack_tasks": Spec(ack_tasks, LIFE, 2),
    "fail_task": Spec(fail_task, LIFE, 2),
    "reap_expired_leases": Spec(reap_expired_leases, LIFE, 2),
    "reap_worker": Spec(reap_worker, LIFE, 2),
    "release_worker": Spec(release_worker, LIFE, 2),
    "give_back_task": Spec(give_back_task, LIFE),
    "cancel_task": Spec(cancel_task, LIFE),
    "reschedule_task": Spec(reschedule_task, LIFE),
    "requeue_dead": Spec(requeue_dead, LIFE),
    "purge_dead": Spec(purge_dead, LIFE),
    "task_status": Spec(task_status, LIFE),
    "set_limits": Spec(set_limits, LIFE, 2),
    "snooze_task": Spec(snooze_task, LIFE, 2),
    "debounce_task": Spec(debounce_task, KEYED, 2),
    "throttle_task": Spec(throttle_task, KEYED, 2),
    "schedule_unique": Spec(schedule_unique, KEYED, 2),
    "sweep_keyed": Spec(sweep_keyed, KEYED),
    "keyed_status": Spec(keyed_status, KEYED),
    "declare_cron": Spec(declare_cron, CRON),
    "set_cron_next": Spec(set_cron_next, CRON),
    "remove_cron": Spec(remove_cron, CRON),
    "due_cron": Spec(due_cron, CRON),
    "fire_cron": Spec(fire_cron, CRON),
    "start_backfill": Spec(start_backfill, CRON),
    "fire_backfill": Spec(fire_backfill, CRON),
    "set_history": Spec(set_history, LIFE),
    "history_page": Spec(history_page, LIFE),
    "task_history": Spec(task_history, LIFE),
}


# --- the fence grid: one task's lease, attempt, cancel, flow slot and history, every way


FENCE = ("ack_tasks", "fail_task", "snooze_task", "heartbeat")
TAKE_BACK = ("reap_expired_leases", "reap_worker", "release_worker")
LEASES = ("runs", "expired", "none", "other worker's")
COUNTERS = ("same", "older", "newer", "none", "garbage")
FLOWS = ("off", "with its slot", "without its slot")
HISTORIES = ("default", "off", "damaged")


def grid(name: str) -> list[tuple[Any, ...]]:
    """The cases of the grid of ``name``: tuples of its dimensions' values."""
    cancels = (False, True)
    if name in FENCE:
        extra = {"ack_tasks": (0, 60_000), "fail_task": (-1, 1), "snooze_task": ("0", "1")}
        return [
            (lease, counter, cancel, flow, history, more)
            for lease in LEASES
            for counter in COUNTERS
            for cancel in cancels
            for flow in FLOWS
            for history in HISTORIES
            for more in extra.get(name, (None,))
        ]
    if name in TAKE_BACK:
        return [
            (lease, known, cancel, flow, history, registered)
            for lease in ("runs", "expired", "none")
            for known in (True, False)
            for cancel in cancels
            for flow in FLOWS
            for history in HISTORIES
            for registered in (True, False)
        ]
    return []


def grid_world(rng: random.Random, now: int, point: tuple[Any, ...], fence: bool) -> Data:
    """A random queue (build_world), with task "f" in worker w1's list as ``point`` says."""
    lease, second, cancel, flow, history_kind, _ = point
    d = build_world(rng, now)
    for key in (K.limits, K.running, K.history_state):
        d.hashes.pop(key, None)
        d.zsets.pop(key, None)
    d.hset(K.tasks, "f", envelope(random.Random(1), "send", now - 100))
    if not fence and not second:
        d.hashes[K.tasks].pop("f")  # an id that is no task
    d.rpush(K.active("w1"), "f")
    deadline = {"runs": now + 5000, "expired": now - 1, "none": None, "other worker's": None}
    if deadline.get(lease) is not None:
        d.zadd(K.leases, "w1|f", deadline[lease])
    if lease == "other worker's":
        d.zadd(K.leases, "w2|f", now + 5000)
    counter = {"same": 2, "older": 1, "newer": 3, "none": None, "garbage": "x"}
    stored = counter[second] if fence else 2
    if stored is not None:
        d.hset(K.attempts, "f", stored)
    if cancel:
        d.hset(K.cancelling, "f", now - 10)
    if flow != "off":
        d.hset(K.limits, "since", now - 1000)
        d.hset(K.limits, "each_concurrency", 1)
        d.hset(K.flow_records, "f", "0|1|000001799999999|a")
        d.hset(K.flow_records, "g", "0|1|000001799999998|a")
        d.hset(K.tasks, "g", envelope(random.Random(2), "send", now - 200))
        d.zadd(K.due, "a\0" + "000001799999998\0g", 0)
        if flow == "with its slot":
            d.zadd(K.running, "a\0w1|f", 0)
    if history_kind == "off":
        d.hset(K.history_state, "size", 0)
    elif history_kind == "damaged":
        d.strings[K.history] = "damaged"
        d.lists.pop(K.history, None)
    return d


def grid_call(name: str, c: Case, point: tuple[Any, ...]) -> Call:
    more = point[5]
    if name == "ack_tasks":
        record = packed_record("f", "send", 2, c.now, "w1", 100, 7)
        keys = [
            K.active("w1"), K.leases, K.attempts, K.tasks, K.errors, K.stats, K.minutes,
            *K.flow_keys, K.wake, K.ready, *K.history_keys, K.cancelling, K.flow_holds,
        ]  # fmt: skip
        if more:
            keys.append(K.result("f"))
        flat = ["f", 2, more, b"\x96\xc3\x01", 7, record]
        return keys, [c.now, "w1", packed_arguments(flat), packed_arguments([300])]
    if name == "fail_task":
        keys, args = fail_task(c)
        keys[0], keys[8] = K.active("w1"), K.result("f")
        args[1:4] = ["w1", "f", "2"]
        args[5] = -1 if more < 0 else c.now + 1000
        args[6] = 60_000
        return keys, args
    if name == "snooze_task":
        keys, args = snooze_task(c)
        keys[0] = K.active("w1")
        args[1:4] = ["w1", "f", "2"]
        args[5] = more
        return keys, args
    if name == "heartbeat":
        keys = [K.workers, K.leases, K.attempts, K.active("w1"), K.stats, K.cancelling]
        return keys, [c.now, c.now + 30_000, "w1", 0, "f", 2]
    if name == "reap_expired_leases":
        keys, _ = reap_expired_leases(c)
        return [*keys[:20], K.active("w1")], [c.now, "w1|f", 21]
    if name == "reap_worker":
        keys, args = reap_worker(c)
        keys[1] = K.active("w1")
        return keys, [c.now, "w1", c.now - (10**7 if point[5] else 0), -1]
    keys, args = release_worker(c)
    keys[1] = K.active("w1")
    args[0] = "w1"
    return keys, args


# --- running and comparing


@dataclass
class Scripts:
    old: dict[str, str]  # name -> sha
    new: dict[str, str]


def normal(value: Any) -> Any:
    if isinstance(value, list):
        return [normal(item) for item in value]
    return value


def run(client: redis.Redis, sha: str, call: Call) -> Any:
    keys, args = call
    try:
        return normal(client.evalsha(sha, len(keys), *keys, *args))
    except redis.ResponseError as error:
        return ("error", LINE.sub("user_script:N", SCRIPT_PLACE.sub("", str(error))))


def snapshot(client: redis.Redis) -> dict[bytes, tuple[bytes, Any, bool]]:
    keys = sorted(client.scan_iter(count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
        pipe.pttl(key)
    read = pipe.execute()
    types = read[0::2]
    pipe = client.pipeline(transaction=False)
    for key, kind in zip(keys, types, strict=True):
        if kind == b"string":
            pipe.get(key)
        elif kind == b"list":
            pipe.lrange(key, 0, -1)
        elif kind == b"hash":
            pipe.hgetall(key)
        elif kind == b"zset":
            command(pipe, "ZRANGE", key, 0, -1, "WITHSCORES")
        else:
            command(pipe, "DUMP", key)
    contents = pipe.execute()
    return {
        key: (kind, content, ttl > 0)
        for key, kind, content, ttl in zip(keys, types, contents, read[1::2], strict=True)
    }


def copy_all(client: redis.Redis, databases: Sequence[int]) -> None:
    pipe = client.pipeline(transaction=False)
    for key in client.scan_iter(count=1000):
        for db in databases:
            command(pipe, "COPY", key, key, "DB", db, "REPLACE")
    pipe.execute()


def damage(case: Case, call: Call) -> list[str]:
    """Give one or two of the call's keys the wrong type; the keys damaged."""
    keys = sorted(set(call[0]))
    chosen = case.rng.sample(keys, min(len(keys), case.rng.choice((1, 1, 1, 2))))
    for key in chosen:
        if case.client.type(key) == b"string":
            case.client.delete(key)
            case.client.hset(key, "damaged", 1)
        else:
            case.client.delete(key)
            case.client.set(key, "damaged")
    return chosen


def differences(a: dict[bytes, Any], b: dict[bytes, Any]) -> list[str]:
    found = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            found.append(f"  {key!r}:\n    old {a.get(key)!r}\n    new {b.get(key)!r}")
    return found


@dataclass
class Tally:
    cases: int = 0
    damaged: int = 0
    #: Cases on a queue under flow control, and cases whose call wrote something.
    flow: int = 0
    changed: int = 0
    replies: Counter[str] = field(default_factory=Counter)
    differences: int = 0


def kind_of(reply: Any) -> str:
    if isinstance(reply, tuple):
        return "error: " + str(reply[1]).split(" ")[0]
    return "reply"


def one_case(
    name: str,
    number: int,
    seed: int,
    clients: Sequence[redis.Redis],
    scripts: Scripts,
    tally: Tally,
    verbose: bool,
    point: tuple[Any, ...] | None = None,
) -> bool:
    """Run case ``number`` of script ``name`` (of its grid, at ``point``, if given);
    whether old and new agreed."""
    rng = random.Random(f"{seed}:{name}:{'grid' if point else ''}{number}")
    base, old_db, new_db = clients
    base.flushall()
    now = BASE_MS + rng.randrange(10**6)
    spec = SPECS[name]
    if point is None:
        build_world(rng, now).write(base)
        for _ in range(rng.choice((0, 1, 2, 3, 4))):
            warm = rng.choice(spec.warm)
            now += rng.randint(0, 2000)
            run(base, scripts.new[warm], SPECS[warm].draw(Case(rng, base, now)))
        now += rng.randint(0, 2000)
        case = Case(rng, base, now)
        call = spec.draw(case)
        damaged = damage(case, call) if rng.random() < 0.16 else []
    else:
        grid_world(rng, now, point, name in FENCE).write(base)
        case = Case(rng, base, now)
        call = grid_call(name, case, point)
        damaged = []
    copy_all(base, (1, 2))
    before = snapshot(base)
    old = run(old_db, scripts.old[name], call)
    new = run(new_db, scripts.new[name], call)
    after = snapshot(new_db)
    tally.cases += 1
    tally.damaged += bool(damaged)
    tally.flow += base.exists(K.limits) == 1
    tally.changed += after != before
    tally.replies[kind_of(new)] += 1
    found = differences(snapshot(old_db), after)
    if old != new:
        found.insert(0, f"  reply:\n    old {old!r}\n    new {new!r}")
    if found:
        tally.differences += 1
        where = f"grid case {number} {point}" if point else f"case {number}"
        print(f"DIFFERENCE {name} {where} (damaged {damaged}):")
        print(f"  KEYS {call[0]}\n  ARGV {call[1]!r}")
        print("\n".join(found))
    elif verbose:
        print(f"{name} case {number}: {kind_of(new)}")
    return not found


def report(name: str, kind: str, tally: Tally) -> None:
    kinds = ", ".join(f"{reply} {count}" for reply, count in tally.replies.most_common())
    print(
        f"{name:20} {kind:6} {tally.cases:5} cases ({tally.flow} under flow control, "
        f"{tally.changed} writing, {tally.damaged} with keys of the wrong type): {kinds}; "
        f"differences: {tally.differences}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="the reference revision (default: merge base)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--cases", type=int, default=300, help="cases per script (x weight)")
    parser.add_argument("--script", action="append", help="only this script (repeatable)")
    parser.add_argument("--case", type=int, help="only this case number")
    parser.add_argument("--no-grid", action="store_true", help="random cases only")
    parser.add_argument("--verbose", action="store_true")
    options = parser.parse_args(argv)
    revision = options.against or default_revision()
    old_sources = revision_sources(revision)
    new_sources = tree_sources()
    names = options.script or sorted(SPECS)
    unknown = set(names) - set(SPECS)
    if unknown:
        parser.error(f"no generator for {', '.join(sorted(unknown))}")
    untested = set(new_sources) - set(SPECS)
    if untested:
        print(f"scripts without a generator (not compared): {', '.join(sorted(untested))}")
    print(f"comparing the scripts of {revision} (old) with the tree's (new), seed {options.seed}")
    for name in names:
        if name not in old_sources:
            print(f"  {name}: new, no old script to compare with")
        elif commands_of(old_sources[name]) != commands_of(new_sources[name]):
            gone = commands_of(old_sources[name]) - commands_of(new_sources[name])
            added = commands_of(new_sources[name]) - commands_of(old_sources[name])
            print(f"  {name}: commands in its text: gone {sorted(gone)}, added {sorted(added)}")
    with tempfile.TemporaryDirectory(prefix="compare-scripts-") as workdir:
        server = Server("redis", Path(workdir))
        server.start()
        try:
            clients = [
                redis.Redis(host="127.0.0.1", port=server.port, db=db, socket_timeout=60)
                for db in (0, 1, 2)
            ]
            scripts = Scripts(
                {n: clients[0].script_load(s) for n, s in old_sources.items() if n in SPECS},
                {n: clients[0].script_load(s) for n, s in new_sources.items()},
            )
            total, failed = 0, 0
            for name in names:
                if name not in scripts.old:
                    continue
                numbers = (
                    [options.case]
                    if options.case is not None
                    else range(options.cases * SPECS[name].weight)
                )
                tally = Tally()
                for number in numbers:
                    one_case(name, number, options.seed, clients, scripts, tally, options.verbose)
                report(name, "random", tally)
                total, failed = total + tally.cases, failed + tally.differences
                points = [] if options.no_grid or options.case is not None else grid(name)
                if points:
                    tally = Tally()
                    for number, point in enumerate(points):
                        one_case(
                            name, number, options.seed, clients, scripts, tally,
                            options.verbose, point,
                        )  # fmt: skip
                    report(name, "grid", tally)
                    total, failed = total + tally.cases, failed + tally.differences
            print(f"total: {total} cases, {failed} with a difference")
        finally:
            server.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
