"""The handler registry: which code a worker may run, by name.

A message names a handler; it never names an import path, so queue content cannot
make a worker execute arbitrary code. ``App`` maps names to functions; a raw
``schedule_task(ts, data)`` (no task name) goes to the app's default handler.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from duetime import validation
from duetime.errors import ConfigurationError, UnknownHandlerError
from duetime.hooks import HookChain, Hooks
from duetime.settings import MOST_SNOOZES

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Handler:
    name: str
    function: Callable[[Any], Any]
    is_async: bool
    #: Snoozes a task of this handler may take in all; None: Settings.max_snoozes.
    max_snoozes: int | None = None


class App:
    """Handlers a worker runs. Decorate functions with ``@app.task`` (named after the
    function, or ``@app.task(name=...)``) and ``@app.default`` for tasks with no name.
    A handler takes the task data as its one argument; async handlers run on the event
    loop, plain functions in the worker's thread pool. ``hooks`` (see duetime.hooks)
    hear about each attempt, retry and dead task of the workers that run this app."""

    def __init__(
        self, default: Callable[[Any], Any] | None = None, hooks: Iterable[Hooks] = ()
    ) -> None:
        self._handlers: dict[str, Handler] = {}
        self.hooks = HookChain(hooks)
        if default is not None:
            self.default(default)

    def add_hooks(self, *hooks: Hooks) -> None:
        """Add hooks, called after those added before."""
        for hook in hooks:
            self.hooks.add(hook)

    @overload
    def task(
        self, function: F, *, name: str | None = None, max_snoozes: int | None = None
    ) -> F: ...
    @overload
    def task(
        self, function: None = None, *, name: str | None = None, max_snoozes: int | None = None
    ) -> Callable[[F], F]: ...

    def task(
        self, function: F | None = None, *, name: str | None = None, max_snoozes: int | None = None
    ) -> F | Callable[[F], F]:
        """Register a handler. ``max_snoozes``: how many times a task of it may snooze in
        all (None: ``Settings.max_snoozes``)."""
        if max_snoozes is not None:
            validation.whole_number(max_snoozes, "max_snoozes", 0, MOST_SNOOZES)

        def register(fn: F) -> F:
            self._add(validation.task_name(name or fn.__name__), fn, max_snoozes)
            return fn

        return register(function) if function is not None else register

    def default(self, function: F) -> F:
        """Register the handler for tasks scheduled without a task name."""
        self._add("", function)
        return function

    def _add(
        self, name: str, function: Callable[[Any], Any], max_snoozes: int | None = None
    ) -> None:
        if not callable(function):
            raise ConfigurationError(f"handler {name!r} is not callable")
        existing = self._handlers.get(name)
        if existing is not None and existing.function is not function:
            raise ConfigurationError(f"two handlers registered as {name or '(default)'!r}")
        self._handlers[name] = Handler(
            name, function, inspect.iscoroutinefunction(function), max_snoozes
        )
        if name:
            # Lets callers pass the function itself as task=... when scheduling.
            with contextlib.suppress(AttributeError):  # e.g. a builtin function
                function.duetime_name = name  # type: ignore[attr-defined]

    def handler(self, name: str) -> Handler:
        try:
            return self._handlers[name]
        except KeyError:
            known = ", ".join(sorted(repr(n) for n in self._handlers if n)) or "none"
            what = "no default handler" if not name else f"no handler named {name!r}"
            raise UnknownHandlerError(
                f"{what} is registered in this worker's app (registered: {known})"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._handlers)

    @classmethod
    def coerce(cls, target: object) -> App:
        """An App from an App, a mapping of names to functions, or a single function
        (which becomes the default handler)."""
        if isinstance(target, App):
            return target
        if isinstance(target, Mapping):
            app = cls()
            for name, function in target.items():
                if name == "":
                    app.default(function)
                else:
                    app.task(function, name=name)
            return app
        if callable(target):
            return cls(default=target)
        raise ConfigurationError(
            f"expected a duetime.App, a dict of handlers or a function, got {type(target).__name__}"
        )
