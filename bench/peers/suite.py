"""Runs the scenarios for every system, repeated and interleaved, and writes the results.

Interleaving: repeat r runs system after system (the order rotated each repeat), so a
burst of load from someone else on the machine hits every system alike. Exceptions:
``scale`` runs system by system (a 1M-task backlog is built once per system and level,
then measured ``--repeat`` times), and ``recovery`` runs every system at once (its
figures are seconds-long timeouts; the systems' keys do not overlap). The opt-in ``flow``
scenario (flow.py) runs only for the systems whose adapters have flow limits.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
from benchlib import Server, git_revision, json_safe

from peers import flow, report, scenarios
from peers.harness import ChildError, Harness, System, warn
from peers.scenarios import FULL, QUICK, Sizes
from peers.venvs import RUNNER, Venv, ensure_all, systems

RESULTS = Path(__file__).resolve().parents[1] / "results"
SCENARIOS = ("punctuality", "throughput", "enqueue", "memory", "scale", "recovery")
OPT_IN = ("flow",)  # run only when named with --scenario


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/peers/run.py",
        description=(
            "duetime side by side with RQ, arq, Dramatiq, Huey, Celery, SAQ, BullMQ and Docket."
        ),
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS + OPT_IN,
        help="run only this scenario (repeatable; default: all but flow, which runs only "
        "when named, and then by default only for the systems with flow limits)",
    )
    parser.add_argument(
        "--system",
        action="append",
        choices=systems(),
        help="run only this system (repeatable; default: all)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per figure; the median is reported (default 3)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes (scale: 10k/100k only), for a smoke run"
    )
    parser.add_argument(
        "--memory-repeat",
        type=int,
        default=1,
        help="runs of the memory scenario (default 1: byte counts are deterministic)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="worker processes per system (default 1, the same for all)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="only rebuild peers.md and peers.png from the existing peers.json",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="do not keep scenarios of the previous peers.json that were not run now",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=RESULTS,
        help="directory for peers.json, peers.md and peers.png",
    )
    return parser.parse_args(argv)  # fmt: skip


@contextlib.contextmanager
def session(processes: int) -> Iterator[Harness]:
    """A private Redis server and scratch directory; every process is killed on the way
    out, whatever happens."""
    workdir = Path(tempfile.mkdtemp(prefix="duetime-peers-"))
    server = Server("redis", workdir)
    harness = Harness(server, workdir, processes)
    try:
        server.start()
        yield harness
    finally:
        harness.kill_all()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def prepare_systems(h: Harness, names: list[str], venvs: dict[str, Venv]) -> list[System]:
    found = []
    for name in names:
        venv = venvs[name]
        system = System(name, venv, error=venv.error)
        if not system.error:
            try:
                system.info = h.describe(system)
            except (ChildError, subprocess.TimeoutExpired) as error:
                system.error = f"cannot be imported: {error}"
        found.append(system)
    return found


def attempt(
    what: str, errors: dict[str, str], system: System, call: Callable[[], dict[str, Any]]
) -> dict[str, Any] | None:
    """Run one measurement; a failure is recorded against the system, not fatal."""
    print(f"  {what} ...", end="", flush=True)
    began = time.monotonic()
    try:
        result = call()
    except (ChildError, RuntimeError, OSError, redis.RedisError) as error:
        print(f" FAILED ({error})", flush=True)
        errors.setdefault(system.name, f"{what}: {error}")
        traceback.print_exc()
        return None
    print(f" {time.monotonic() - began:.1f} s  {report.brief(result)}", flush=True)
    return result


def rotated(items: list[System], r: int) -> list[System]:
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def run_scenarios(
    h: Harness,
    chosen: list[str],
    runnable: list[System],
    sizes: Sizes,
    repeat: int,
    memory_repeat: int,
    quick: bool = False,
) -> tuple[dict[str, Any], dict[str, dict[str, str]], dict[str, dict[str, Any]]]:
    results: dict[str, Any] = {}
    errors: dict[str, dict[str, str]] = {name: {} for name in SCENARIOS + OPT_IN}
    timing: dict[str, dict[str, Any]] = {}

    def interleaved(
        name: str,
        one: Callable[[System, int], dict[str, Any]],
        runs: int = repeat,
        among: list[System] = runnable,
    ) -> None:
        table: dict[str, list[dict[str, Any]]] = {s.name: [] for s in among}
        for r in range(runs):
            for system in rotated(among, r):
                if system.name in errors[name]:
                    continue
                label = f"{name} {system.name} run {r + 1}/{runs}"
                result = attempt(label, errors[name], system, functools.partial(one, system, r))
                if result is not None:
                    table[system.name].append(result)
        results[name] = table

    for name in chosen:
        print(f"\n== {name}", flush=True)
        began = time.monotonic()
        timing[name] = {
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "load_average_at_start": list(os.getloadavg()),
            "repeat": memory_repeat if name == "memory" else repeat,
            "git": git_revision(Path(__file__).resolve().parent),
        }
        if name == "punctuality":
            interleaved(name, lambda s, r: scenarios.punctuality(h, s, sizes, seed=1000 + r))
        elif name == "throughput":
            interleaved(
                name,
                lambda s, r: {
                    "noop": scenarios.throughput(h, s, sizes, "noop"),
                    "io": scenarios.throughput(h, s, sizes, "io"),
                },
            )
        elif name == "enqueue":
            interleaved(name, lambda s, r: scenarios.enqueue(h, s, sizes))
        elif name == "memory":
            interleaved(name, lambda s, r: scenarios.memory(h, s, sizes), memory_repeat)
        elif name == "scale":
            table: dict[str, list[dict[str, Any]]] = {}
            for system in runnable:
                table[system.name] = []
                for backlog in sizes.scale_levels:
                    label = f"scale {system.name} backlog {backlog:,}"
                    if table[system.name]:  # estimate the fill from the previous level
                        previous = table[system.name][-1]
                        estimate = previous["fill_s"] * backlog / previous["backlog"]
                        if estimate > sizes.fill_budget:
                            why = (f"skipped: building the backlog would take ~{estimate:.0f} s "
                                   f"(budget {sizes.fill_budget:.0f} s)")  # fmt: skip
                            print(f"  {label}: {why}", flush=True)
                            table[system.name].append({"backlog": backlog, "fill_s": estimate,
                                                       "skipped": why, "runs": []})  # fmt: skip
                            continue
                    measure = functools.partial(
                        scenarios.scale_level, h, system, sizes, backlog, repeat
                    )
                    level = attempt(label, errors[name], system, measure)
                    if level is None:
                        break
                    table[system.name].append(level)
            results[name] = table
        elif name == "recovery":
            rounds: dict[str, list[dict[str, Any]]] = {s.name: [] for s in runnable}
            for r in range(repeat):
                # A system that did not recover within the cap will not next time either.
                these = [
                    s for s in runnable
                    if not any(x["problem"] for x in rounds[s.name])
                ]  # fmt: skip
                if not these:
                    break
                print(f"  recovery round {r + 1}/{repeat}: {', '.join(s.name for s in these)}",
                      flush=True)  # fmt: skip
                outcome = scenarios.recovery(h, these, sizes.recovery_cap)
                for system_name, figure in outcome.items():
                    rounds[system_name].append(figure)
                    shown = figure["problem"] or f"{figure['seconds']:.2f} s"
                    print(f"    {system_name:9} {shown}", flush=True)
            results[name] = rounds
        elif name == "flow":
            limited = [s for s in runnable if flow.supported(s)]
            measure = functools.partial(flow.run, h, sizes=flow.QUICK if quick else flow.FULL)
            interleaved(name, lambda s, r: measure(s), among=limited)  # noqa: B023 (run at once)
        timing[name]["load_average_at_end"] = list(os.getloadavg())
        timing[name]["seconds"] = time.monotonic() - began
        print(f"  ({name} took {time.monotonic() - began:.0f} s)", flush=True)
    return results, errors, timing


# --- the physical reference ----------------------------------------------------------

#: A small script of the kind duetime runs: a write and a read on one list.
SMALL_SCRIPT = "redis.call('RPUSH', KEYS[1], ARGV[1]) return redis.call('LPOP', KEYS[1])"


def redis_benchmark(h: Harness) -> list[dict[str, Any]]:
    """redis-benchmark against the suite's server for the commands duetime sends, at one
    connection (what one process doing one call at a time can reach) and at 50."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return []
    h.server.reset()
    client = h.server.redis
    sha = client.script_load(SMALL_SCRIPT)
    client.rpush("bench:l", "x")
    custom = {
        "EVALSHA (RPUSH+LPOP script)": ["evalsha", sha, "1", "bench:s", "x"],
        "LMOVE (rotate a list)": ["lmove", "bench:l", "bench:l", "LEFT", "RIGHT"],
        "BLMOVE (non-empty list)": ["blmove", "bench:l", "bench:l", "LEFT", "RIGHT", "1"],
    }
    rows = []
    for clients, requests in ((1, 20_000), (50, 100_000)):
        base = [binary, "-h", "127.0.0.1", "-p", str(h.server.port), "-c", str(clients),
                "-n", str(requests), "--csv"]  # fmt: skip
        runs: list[tuple[str | None, list[str]]] = [(None, [*base, "-t", "zadd,rpush,lpush,lpop"])]
        runs += [(label, [*base, *command]) for label, command in custom.items()]
        for label, command in runs:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            for line in done.stdout.splitlines()[1:]:
                cells = [c.strip('"') for c in line.split(",")]
                if len(cells) < 2:
                    continue
                rows.append({
                    "command": label or cells[0],
                    "clients": clients,
                    "per_second": float(cells[1]),
                    "p50_ms": float(cells[4]) if len(cells) > 4 else None,
                })  # fmt: skip
    h.server.reset()
    return rows


def merge(path: Path, document: dict[str, Any]) -> dict[str, Any]:
    """Scenarios not run this time are kept from the previous peers.json, when it was
    made with the same sizes and worker process count; each keeps its own timing."""
    try:
        previous: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return document
    env, old_env = document["environment"], previous.get("environment", {})
    same = [json.loads(json.dumps(env[k])) == old_env.get(k) for k in
            ("quick", "worker_processes", "sizes")]  # fmt: skip
    if not all(same):
        return document
    ran = set(document["results"])
    kept = {k: v for k, v in previous.get("results", {}).items() if k not in ran}
    if not kept:
        return document
    old_timing = previous.get("scenarios", {})
    for name in kept:  # a file from before per-scenario timing: use its run's
        old_timing.setdefault(name, {
            "measured_at": old_env.get("measured_at"),
            "load_average_at_start": old_env.get("load_average_at_start"),
            "load_average_at_end": old_env.get("load_average_at_end"),
            "repeat": old_env.get("repeat"),
            "git": old_env.get("git"),
        })  # fmt: skip
    systems_info = {**previous.get("systems", {}), **document["systems"]}
    errors = {k: v for k, v in previous.get("errors", {}).items() if k not in ran}
    print(f"kept from the previous {path.name}: {', '.join(sorted(kept))}")
    return {
        **document,
        "systems": systems_info,
        "errors": {**errors, **document["errors"]},
        "results": {**kept, **document["results"]},
        "scenarios": {**{k: old_timing[k] for k in kept}, **document["scenarios"]},
    }


# --- entry point ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the server and every child process are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.report_only:
        return write_report(json.loads((args.output / "peers.json").read_text()), args.output)
    sizes = QUICK if args.quick else FULL
    chosen = [s for s in SCENARIOS + OPT_IN if s in (args.scenario or SCENARIOS)]
    default = list(flow.SYSTEMS) if set(chosen) <= set(OPT_IN) else systems()
    names = [s for s in systems() if s in (args.system or default)]
    if RUNNER not in names:
        names.insert(0, RUNNER)  # ratios need duetime
    venvs = ensure_all(names)
    load_start = os.getloadavg()
    began = time.time()
    with session(args.processes) as h:
        all_systems = prepare_systems(h, names, venvs)
        runnable = [s for s in all_systems if not s.error]
        for s in all_systems:
            if s.error:
                warn(f"{s.name} cannot run here: {s.error}")
        print(f"server: redis {h.server.version()} at {h.server.url}; systems: "
              f"{', '.join(s.name for s in runnable)}; load average {load_start[0]:.2f}",
              flush=True)  # fmt: skip
        results, errors, timing = run_scenarios(
            h, chosen, runnable, sizes, max(1, args.repeat), max(1, args.memory_repeat),
            args.quick,
        )  # fmt: skip
        print("\n== redis-benchmark (physical reference)", flush=True)
        reference = redis_benchmark(h)
        server_version = h.server.version()
    environment = {
        "server": f"redis {server_version} (persistence off, loopback)",
        "git": git_revision(Path(__file__).resolve().parent),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_at_start": list(load_start),
        "load_average_at_end": list(os.getloadavg()),
        "quick": args.quick,
        "repeat": args.repeat,
        "memory_repeat": args.memory_repeat,
        "worker_processes": args.processes,
        "sizes": dataclasses.asdict(sizes),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_seconds": time.time() - began,
    }
    document = {
        "environment": environment,
        "systems": {
            s.name: {
                "error": s.error,
                "versions": s.info.get("versions", {}),
                "bulk_api": s.bulk,
                "settings": s.info.get("settings", {}),
                "flow": s.info.get("flow", {}),
            }
            for s in all_systems
        },
        "errors": {k: v for k, v in errors.items() if v},
        "results": results,
        "scenarios": timing,
        "redis_benchmark": reference,
    }
    if not args.fresh:
        document = merge(args.output / "peers.json", document)
    return write_report(document, args.output)


def write_report(document: dict[str, Any], output: Path) -> int:
    """peers.json (with the summary), peers.md and peers.png; the markdown is printed."""
    document["summary"] = report.summarise(document)
    output.mkdir(parents=True, exist_ok=True)
    (output / "peers.json").write_text(
        json.dumps(json_safe(document), indent=1, allow_nan=False) + "\n"
    )
    markdown = report.markdown(document)
    (output / "peers.md").write_text(markdown)
    chart = report.chart(document, output / "peers.png")
    print()
    print(markdown)
    written = [output / "peers.json", output / "peers.md", *([chart] if chart else [])]
    print("written: " + ", ".join(str(p) for p in written))
    return 0
