"""Serving the dashboard with uvicorn: the bind-address check comes first, so an
exposed dashboard without credentials is refused before anything listens."""

from __future__ import annotations

from collections.abc import Sequence

from duetime.dashboard.app import create_app
from duetime.dashboard.security import Credentials, check_exposure
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.store.redis.runner import RedisSpec


def serve(
    queues: Sequence[str],
    redis: RedisSpec = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    shards: int = 1,
    settings: Settings = DEFAULT_SETTINGS,
    token: str | None = None,
    basic_auth: str | tuple[str, str] | None = None,
    refresh_seconds: float = 5.0,
    log_level: str = "info",
    viewer_token: str | None = None,
    viewer_basic_auth: str | tuple[str, str] | None = None,
) -> None:
    """Run the dashboard until interrupted (Ctrl-C or SIGTERM).

    Bound to anything but a loopback address, it needs credentials (``token`` or
    ``basic_auth``, "user:password", and/or the viewer's); without any it raises
    ConfigurationError saying what to give.
    """
    check_exposure(host, Credentials.of(token, basic_auth, viewer_token, viewer_basic_auth))
    app = create_app(
        queues, redis, shards=shards, settings=settings, token=token,
        basic_auth=basic_auth, refresh_seconds=refresh_seconds, viewer_token=viewer_token,
        viewer_basic_auth=viewer_basic_auth,
    )  # fmt: skip
    import uvicorn  # the dashboard extra; imported only when serving

    uvicorn.run(app, host=host, port=port, log_level=log_level, server_header=False)
