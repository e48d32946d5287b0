"""Every tunable of duetime, with its default and why, in one place."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from duetime.errors import ConfigurationError

#: Settings for which 0 is meaningful (it turns the feature off).
_MAY_BE_ZERO = frozenset({"promote_ahead"})
MOST_PROMOTE_AHEAD = 1.0


@dataclass(frozen=True, slots=True)
class Settings:
    """Knobs shared by the client, the dispatcher and the worker.

    Durations are in seconds. The defaults favour fast recovery on one host;
    raise ``lease_duration`` and ``worker_ttl`` where pauses (GC, swapping,
    slow networks) are longer than a few seconds.
    """

    #: How long a claimed task stays leased without renewal. A worker renews the
    #: leases of its running tasks every ``heartbeat_interval``.
    lease_duration: float = 10.0
    #: How often a worker proves it is alive and renews its leases.
    heartbeat_interval: float = 1.0
    #: A worker silent for this long is dead: its processing list is re-entered.
    worker_ttl: float = 5.0
    #: Longest a blocking call (BLMOVE, BLPOP) waits on the server before it
    #: returns, so a daemon notices shutdown and a silent connection in bounded time.
    block_timeout: float = 2.0
    #: Socket timeout for ordinary commands; a hung socket fails after this.
    socket_timeout: float = 5.0
    #: Most due tasks moved to ``ready`` by one promote script call.
    promote_batch: int = 1000
    #: How long before its run-at a task may be moved to ``ready``. The worker that
    #: claims it waits on a precise local timer until the run-at, so the round trips
    #: of promoting and claiming are done before the task is due rather than after.
    #: 0 promotes at the run-at.
    promote_ahead: float = 0.005
    #: Most tasks a worker claims in one script call when there is a backlog.
    claim_batch: int = 100
    #: Largest encoded task data accepted by ``schedule_task``.
    max_payload_bytes: int = 512 * 1024
    #: Attempts (first run included) before a task goes to the dead-letter set.
    max_attempts: int = 5
    #: Seconds a single attempt may run before it is timed out and retried.
    task_timeout: float = 300.0
    #: Exponential back-off between attempts: base * 2**(attempt-1), capped, jittered.
    retry_base: float = 1.0
    retry_max: float = 600.0
    #: Dead tasks are dropped after this long, and beyond this many (oldest first).
    dead_ttl: float = 7 * 24 * 3600.0
    dead_max: int = 10_000
    #: On SIGTERM, how long running tasks may finish before they are handed back.
    shutdown_grace: float = 30.0
    #: How often the server clock offset is re-sampled with TIME.
    clock_resync_interval: float = 5.0
    #: How often a dispatcher sweeps for orphan processing lists and trims dead tasks.
    maintenance_interval: float = 30.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in _MAY_BE_ZERO and value == 0:
                continue
            if not isinstance(value, int | float) or value <= 0:
                raise ConfigurationError(
                    f"setting {field.name} must be a positive number, got {value!r}"
                )
        if self.promote_ahead > MOST_PROMOTE_AHEAD:
            raise ConfigurationError(
                f"promote_ahead must be at most {MOST_PROMOTE_AHEAD:g}s (a task promoted "
                f"ahead holds a worker slot while it waits), got {self.promote_ahead!r}"
            )
        if self.heartbeat_interval * 2 > self.lease_duration:
            raise ConfigurationError(
                "lease_duration must be at least twice heartbeat_interval, "
                "or leases expire between two renewals"
            )
        if self.heartbeat_interval * 2 > self.worker_ttl:
            raise ConfigurationError("worker_ttl must be at least twice heartbeat_interval")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Defaults overridden by $DUETIME_<FIELD> variables (e.g. DUETIME_LEASE_DURATION=30)."""
        environ = os.environ if environ is None else environ
        changes: dict[str, float | int] = {}
        for field in dataclasses.fields(cls):
            variable = f"DUETIME_{field.name.upper()}"
            raw = environ.get(variable)
            if raw is None:
                continue
            try:
                changes[field.name] = int(raw) if field.type == "int" else float(raw)
            except ValueError:
                kind = "an integer" if field.type == "int" else "a number"
                raise ConfigurationError(f"{variable} must be {kind}, got {raw!r}") from None
        return cls(**changes)  # type: ignore[arg-type]

    def replace(self, **changes: float | int) -> Settings:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


DEFAULT_SETTINGS = Settings()
