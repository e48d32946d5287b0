"""Medians, the markdown report, the duetime-to-best-peer ratios and the chart."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from peers import flow

DUETIME = "duetime"


def median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def brief(result: dict[str, Any]) -> str:
    """One line for the progress log."""
    if "rate" in result or "concurrency" in result:
        return flow.brief(result)
    if "noop" in result:
        return (
            f"no-op {result['noop']['per_second']:,.0f}/s, io {result['io']['per_second']:,.0f}/s"
        )
    if "p99" in result and "lateness_ms" in result:
        return f"p50 {fmt_ms(result['p50'])}, p99 {fmt_ms(result['p99'])}, lost {result['lost']}"
    if "single_per_second" in result:
        bulk = result["bulk_per_second"]
        return (
            f"single {result['single_per_second']:,.0f}/s "
            f"(bare round trip {result['roundtrip_per_second']:,.0f}/s)"
            + (f", bulk {bulk:,.0f}/s" if bulk else "")
        )
    if "bytes_per_task" in result:
        return f"{result['bytes_per_task']:.0f} B/task"
    if "backlog" in result:
        parts = [f"p99 {fmt_ms(r['p99'])} lost {r['lost']}" for r in result["runs"]]
        return f"fill {result['fill_s']:.0f} s; " + "; ".join(parts)
    return ""


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 1000:
        return f"{value / 1000:.2f} s"
    return f"{value:.1f} ms"


def fmt_number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def fmt_rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


# --- summary -------------------------------------------------------------------------


def summarise(document: dict[str, Any]) -> dict[str, Any]:
    results = document["results"]
    summary: dict[str, Any] = {}
    if "punctuality" in results:
        summary["punctuality"] = {
            name: {
                key: median(r.get(key) for r in runs)
                for key in (
                    "p50",
                    "p90",
                    "p99",
                    "max",
                    "early",
                    "lost",
                    "duplicate_runs",
                    "left_out_scheduled_late",
                )
            }
            | {"runs": len(runs)}
            for name, runs in results["punctuality"].items()
            if runs
        }
    if "throughput" in results:
        summary["throughput"] = {
            name: {
                f"{variant}{suffix}": median(r[variant][key] for r in runs)
                for variant in ("noop", "io")
                for suffix, key in (("", "per_second"), ("_from_launch", "per_second_from_launch"))
            }
            | {"runs": len(runs)}
            for name, runs in results["throughput"].items()
            if runs
        }
    if "enqueue" in results:
        summary["enqueue"] = {
            name: {
                "single": median(r["single_per_second"] for r in runs),
                # runs from before the bare round trip was measured lack it
                "roundtrip": median(r.get("roundtrip_per_second") for r in runs),
                # per run, then the median: each share is of a round trip timed right
                # after it, so it holds when the machine's speed moves between runs
                "single_share": median(
                    r["single_per_second"] / r["roundtrip_per_second"]
                    for r in runs
                    if r.get("roundtrip_per_second")
                ),
                "bulk": median(r["bulk_per_second"] for r in runs),
                "runs": len(runs),
            }
            for name, runs in results["enqueue"].items()
            if runs
        }
    if "memory" in results:
        summary["memory"] = {
            name: {"bytes_per_task": median(r["bytes_per_task"] for r in runs), "runs": len(runs)}
            for name, runs in results["memory"].items()
            if runs
        }
    if "scale" in results:
        summary["scale"] = {
            name: {
                str(level["backlog"]): {
                    **{k: median(r[k] for r in level["runs"]) for k in ("p50", "p99", "max")},
                    "lost": max((r["lost"] for r in level["runs"]), default=None),
                    "per_second": median(r["per_second"] for r in level["runs"]),
                    "fill_s": level["fill_s"],
                    "runs": len(level["runs"]),
                    "problem": level.get("skipped")
                    or level.get("problem")
                    or level.get("warm_up_problem", ""),
                }
                for level in levels
            }
            for name, levels in results["scale"].items()
            if levels
        }
    if "recovery" in results:
        summary["recovery"] = {
            name: {
                "seconds": median(r["seconds"] for r in rounds),
                "problem": next((r["problem"] for r in rounds if r["problem"]), ""),
                "runs": len(rounds),
            }
            for name, rounds in results["recovery"].items()
            if rounds
        }
    if "flow" in results:
        summary["flow"] = flow.summarise(results["flow"])
    summary["ratios"] = ratios(summary)
    return summary


def ratios(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """duetime's figure over the best peer's, per scenario's headline figure."""
    out: list[dict[str, Any]] = []

    def add(scenario: str, metric: str, table: dict[str, Any], get: Callable[[Any], Any],
            lower_is_better: bool) -> None:  # fmt: skip
        values = {name: get(row) for name, row in table.items()}
        mine = values.pop(DUETIME, None)
        peers = {k: v for k, v in values.items() if v is not None}
        if mine is None or not peers:
            return
        pick = min if lower_is_better else max
        best = pick(peers, key=lambda k: peers[k])
        out.append({
            "scenario": scenario, "metric": metric, "duetime": mine, "best_peer": best,
            "best_value": peers[best],
            "ratio": mine / peers[best] if peers[best] else None,
            "better": "lower" if lower_is_better else "higher",
        })  # fmt: skip

    if p := summary.get("punctuality"):
        add("punctuality", "p99 lateness (ms)", p, lambda r: r["p99"], True)
        add("punctuality", "p50 lateness (ms)", p, lambda r: r["p50"], True)
    if t := summary.get("throughput"):
        add("throughput", "no-op tasks/s", t, lambda r: r["noop"], False)
        add("throughput", "1 ms I/O, c=50, tasks/s", t, lambda r: r["io"], False)
    if e := summary.get("enqueue"):
        add("enqueue", "single calls, tasks/s", e, lambda r: r["single"], False)
        add("enqueue", "single calls ÷ a bare LPUSH round trip", e,
            lambda r: r.get("single_share"), False)  # fmt: skip
        add("enqueue", "bulk API, tasks/s", e, lambda r: r["bulk"], False)
    if m := summary.get("memory"):
        add("memory", "Redis bytes per delayed task", m, lambda r: r["bytes_per_task"], True)
    if s := summary.get("scale"):
        largest = max((int(b) for rows in s.values() for b in rows), default=None)
        if largest is not None:
            key = str(largest)

            def complete(r: Any) -> Any:
                row = r.get(key)
                return row if row and not row["lost"] else None

            add("scale", f"p99 lateness at {largest:,} backlog (ms)", s,
                lambda r: (complete(r) or {}).get("p99"), True)  # fmt: skip
            add("scale", f"burst tasks/s at {largest:,} backlog", s,
                lambda r: (complete(r) or {}).get("per_second"), False)  # fmt: skip
    if r := summary.get("recovery"):
        add("recovery", "seconds from kill -9 to the task running again", r,
            lambda x: x["seconds"], True)  # fmt: skip
    return out


# --- markdown ------------------------------------------------------------------------


def short_settings(document: dict[str, Any], name: str, profile: str) -> str:
    settings = document["systems"][name]["settings"].get(profile, {})
    return "; ".join(settings[k] for k in ("concurrency",) if k in settings)


def markdown(document: dict[str, Any]) -> str:
    env = document["environment"]
    summary = document["summary"]
    lines = [
        "# duetime beside other Redis task queues",
        "",
        f"{env['cpus']} CPUs, {env['server']}, {env['worker_processes']} worker "
        f"process(es) per system, figures are medians of the runs named in each section"
        f"{' (--quick sizes)' if env['quick'] else ''}. The machine is shared with other "
        "people's CPU-heavy tests: each section says when it was measured and the load "
        f"average meanwhile. Last invocation of the suite: {env['measured_at']}, "
        f"{env['wall_seconds'] / 60:.0f} min.",
        "",
        "| system | versions |",
        "|---|---|",
    ]
    for name, info in document["systems"].items():
        versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
        lines.append(f"| {name} | {versions or 'not run: ' + info['error']} |")
    if p := summary.get("punctuality"):
        lines += ["", f"## 1. Punctuality: {env['sizes']['punctuality_tasks']:,} tasks over "
                  f"{env['sizes']['punctuality_spread']:g} s", "",
                  measured(document, "punctuality"), "",
                  "Lateness = handler start - requested run-at (same host clock). Early: started "
                  "before its run-at. Lost: not started within "
                  f"{env['sizes']['grace']:g} s after the last run-at.", "",
                  "Left out: tasks whose run-at passed before the producer had finished "
                  "scheduling (median per run).", "",
                  "| system | p50 | p99 | max | early | lost | left out | settings |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
        for name, row in p.items():
            lines.append(
                f"| {name} | {fmt_ms(row['p50'])} | {fmt_ms(row['p99'])} | {fmt_ms(row['max'])} "
                f"| {row['early']:g} | {row['lost']:g} | {row['left_out_scheduled_late'] or 0:g} | "
                f"{setting(document, name, 'punctual', 'scheduling')} |"
            )
    if t := summary.get("throughput"):
        lines += ["", f"## 2. Throughput: {env['sizes']['throughput_tasks']:,} tasks queued, "
                  "then the workers started", "",
                  measured(document, "throughput"), "",
                  "Tasks/s from the first task's start to the last one's (in brackets: from "
                  "launching the worker processes, start-up included).", "",
                  "| system | no-op | 1 ms I/O per task | concurrency |",
                  "|---|---:|---:|---|"]  # fmt: skip
        for name, row in t.items():
            lines.append(
                f"| {name} | {fmt_rate(row['noop'])} ({fmt_rate(row['noop_from_launch'])}) | "
                f"{fmt_rate(row['io'])} ({fmt_rate(row['io_from_launch'])}) | "
                f"{short_settings(document, name, 'io')} |"
            )
    if e := summary.get("enqueue"):
        lines += ["", "## 3. Enqueue rate from one process (delayed tasks, 1 h out)", "",
                  measured(document, "enqueue"), "",
                  f"Single: {env['sizes']['enqueue_single']:,} calls one after the other. "
                  f"Bulk: {env['sizes']['enqueue_bulk']:,} tasks through the bulk API.", "",
                  "Bare round trip: as many bare `LPUSH` calls through the same "
                  "virtualenv's redis-py, right after the single calls: the ceiling of "
                  "any acknowledged single call from one process. Single ÷ bare: the "
                  "median of each run's ratio.", "",
                  "| system | single calls, tasks/s | bare round trip, calls/s | "
                  "single ÷ bare | bulk, tasks/s | bulk API |",
                  "|---|---:|---:|---:|---:|---|"]  # fmt: skip
        for name, row in e.items():
            api = document["systems"][name]["bulk_api"] or "none"
            share = row.get("single_share")
            lines.append(
                f"| {name} | {fmt_rate(row['single'])} | {fmt_rate(row.get('roundtrip'))} | "
                f"{'n/a' if share is None else f'{share:.2f}'} | {fmt_rate(row['bulk'])} | "
                f"{api} |"
            )
    if m := summary.get("memory"):
        lines += ["", f"## 4. Memory: Redis bytes per delayed task "
                  f"({env['sizes']['memory_tasks']:,} tasks 1 h out, no worker running; "
                  f"{env.get('memory_repeat', 1)} run(s))", "",
                  measured(document, "memory"), "",
                  "| system | bytes/task |", "|---|---:|"]  # fmt: skip
        for name, row in m.items():
            value = row["bytes_per_task"]
            lines.append(f"| {name} | {'n/a' if value is None else f'{value:,.0f}'} |")
    if s := summary.get("scale"):
        lines += ["", f"## 5. Scale: {env['sizes']['scale_due']:,} tasks due at one instant, "
                  "behind a backlog of tasks 1 h out", "",
                  measured(document, "scale"), "",
                  "Lateness of the burst and its rate (tasks started / time from the due "
                  "instant to the last start). Fill: seconds to build the backlog.", "",
                  "| system | backlog | p50 | p99 | max | lost | tasks/s | fill | note |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
        for name, levels in s.items():
            for backlog, row in levels.items():
                lines.append(
                    f"| {name} | {int(backlog):,} | {fmt_ms(row['p50'])} | {fmt_ms(row['p99'])} "
                    f"| {fmt_ms(row['max'])} | {'' if row['lost'] is None else row['lost']} "
                    f"| {fmt_rate(row['per_second'])} "
                    f"| {row['fill_s']:.0f} s | {row['problem']} |"
                )
    if r := summary.get("recovery"):
        lines += ["", "## 6. Recovery: kill -9 of the worker running a task, default settings",
                  "",
                  measured(document, "recovery"), "",
                  "Two workers per system; seconds from the SIGKILL to the task starting "
                  "again.", "",
                  "| system | seconds | settings |", "|---|---:|---|"]  # fmt: skip
        for name, row in r.items():
            shown = row["problem"] or f"{row['seconds']:.2f}"
            lines.append(
                f"| {name} | {shown} | {setting(document, name, 'recovery', 'recovery settings')} |"
            )
    lines += flow.markdown(document, measured(document, "flow"))
    if summary.get("ratios"):
        lines += ["", "## duetime / best peer", "",
                  "| scenario | figure | duetime | best peer | ratio | better |",
                  "|---|---|---:|---|---:|---|"]  # fmt: skip
        for x in summary["ratios"]:
            ratio = "n/a" if x["ratio"] is None else f"{x['ratio']:.2f}"
            lines.append(
                f"| {x['scenario']} | {x['metric']} | {fmt_number(x['duetime'])} | "
                f"{x['best_peer']} ({fmt_number(x['best_value'])}) | {ratio} | {x['better']} |"
            )
    if document.get("redis_benchmark"):
        lines += ["", "## Physical reference: redis-benchmark on the same server", "",
                  "| command | 1 connection, req/s | 50 connections, req/s |",
                  "|---|---:|---:|"]  # fmt: skip
        table: dict[str, dict[int, float]] = {}
        for row in document["redis_benchmark"]:
            table.setdefault(row["command"], {})[row["clients"]] = row["per_second"]
        for command, by_clients in table.items():
            lines.append(
                f"| {command} | {fmt_rate(by_clients.get(1))} | {fmt_rate(by_clients.get(50))} |"
            )
    failed = {n: i["error"] for n, i in document["systems"].items() if i["error"]}
    if failed or document.get("errors"):
        lines += ["", "## Could not run", ""]
        lines += [f"- {name}: {why}" for name, why in failed.items()]
        for scenario, by_system in document.get("errors", {}).items():
            lines += [f"- {scenario}, {name}: {why}" for name, why in by_system.items()]
    lines += ["", "## Settings per system", ""]
    for name, info in document["systems"].items():
        if info["error"]:
            continue
        base = info["settings"].get("punctual", {})
        lines.append(f"- **{name}**: " + "; ".join(f"{k}: {v}" for k, v in base.items()))
        recovery = info["settings"].get("recovery", {})
        lines.append(f"  - recovery run: {recovery.get('concurrency', '')}")
    return "\n".join(lines) + "\n"


def measured(document: dict[str, Any], scenario: str) -> str:
    """When a scenario was measured and how busy the machine was meanwhile."""
    timing = document.get("scenarios", {}).get(scenario)
    if not timing:
        return ""

    def load(values: list[float] | None) -> str:
        return "/".join(f"{x:.1f}" for x in values) if values else "?"

    if "load_average_samples" in timing:  # timing rebuilt by hand from a run's log
        took = f", {timing['seconds'] / 60:.0f} min" if timing.get("seconds") else ""
        return (
            f"_Measured from {timing.get('measured_at')}{took}, {timing.get('repeat')} run(s), "
            f"git {timing.get('git')}; load average samples "
            f"{', '.join(f'{x:g}' for x in timing['load_average_samples'])} "
            f"({timing.get('note', '')})._"
        )
    return (
        f"_Measured {timing.get('measured_at')}, {timing.get('repeat')} run(s), git "
        f"{timing.get('git')}; load average (1/5/15 min) "
        f"{load(timing.get('load_average_at_start'))} at start, "
        f"{load(timing.get('load_average_at_end'))} at end._"
    )


def setting(document: dict[str, Any], name: str, profile: str, key: str) -> str:
    return str(document["systems"][name]["settings"].get(profile, {}).get(key, ""))


# --- chart ---------------------------------------------------------------------------


def chart(document: dict[str, Any], path: Path) -> Path | None:
    """Lateness distributions, throughput, and p99 lateness against the backlog."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    results, summary = document["results"], document["summary"]
    panels = [k for k in ("punctuality", "throughput", "scale") if summary.get(k)]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(6.6 * len(panels), 5.4), squeeze=False)
    colours = plt.get_cmap("tab10")
    names = list(document["systems"])
    colour = {n: colours(i % 10) for i, n in enumerate(names)}
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel == "punctuality":
            shown = [n for n in names if results["punctuality"].get(n)]
            data = [
                [x for run in results["punctuality"][n] for x in run["lateness_ms"]] or [0.0]
                for n in shown
            ]
            box = ax.boxplot(data, whis=(1, 99), showfliers=False, patch_artist=True)
            ax.set_xticks(range(1, len(shown) + 1), shown, rotation=30)
            for patch, n in zip(box["boxes"], shown, strict=True):
                patch.set_facecolor(colour[n])
                patch.set_alpha(0.6)
            ax.set_yscale("symlog", linthresh=1.0)
            ax.axhline(0, color="grey", linewidth=0.8)
            ax.set_ylabel("lateness, ms (symlog; box p25-p75, whiskers p1-p99)")
            ax.set_title(f"Punctuality: {document['environment']['sizes']['punctuality_tasks']:,}"
                         " tasks over 5 s")  # fmt: skip
        elif panel == "throughput":
            rows = summary["throughput"]
            shown = list(rows)
            xs = range(len(shown))
            width = 0.4
            for offset, key, label in ((-width / 2, "noop", "no-op"),
                                       (width / 2, "io", "1 ms I/O, c=50")):  # fmt: skip
                values = [rows[n][key] or 0 for n in shown]
                bars = ax.bar([x + offset for x in xs], values, width, label=label,
                              color=[colour[n] for n in shown],
                              alpha=1.0 if key == "noop" else 0.55,
                              hatch="" if key == "noop" else "//")  # fmt: skip
                ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=7, rotation=90,
                             padding=2)  # fmt: skip
            ax.set_xticks(list(xs), shown, rotation=30)
            ax.set_yscale("log")
            ax.set_ylabel("tasks/s (log)")
            ax.set_title(f"Throughput: {document['environment']['sizes']['throughput_tasks']:,}"
                         " queued tasks, 1 worker process")  # fmt: skip
            ax.legend(loc="upper right", fontsize=8)
        else:
            for n, levels in summary["scale"].items():
                points = [(int(b), row["p99"]) for b, row in levels.items()
                          if row["p99"] is not None and not row["lost"]]  # fmt: skip
                if points:
                    ax.plot(*zip(*points, strict=True), marker="o", label=n, color=colour[n])
            ax.set_xscale("log")
            ax.set_yscale("log")
            top = ax.get_ylim()[1]
            for n, levels in summary["scale"].items():
                lost = [int(b) for b, row in levels.items() if row["lost"]]
                if lost:
                    where = ", ".join(f"{b:,}" for b in lost)
                    ax.plot(lost, [top] * len(lost), marker="x", linestyle="none",
                            color=colour[n], markersize=9, clip_on=False,
                            label=f"{n}: burst lost at {where}")  # fmt: skip
            ax.set_xlabel("backlog of tasks 1 h out (log)")
            ax.set_ylabel("p99 lateness of the burst, ms (log)")
            ax.set_title(f"Scale: {document['environment']['sizes']['scale_due']:,} due at once "
                         "(x: tasks lost at that backlog)")  # fmt: skip
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
