"""The web dashboard: server-rendered pages over the public ``AsyncQueue`` API to watch
queues and act on their tasks (install the ``dashboard`` extra).

``serve(...)`` runs it with uvicorn; ``create_app(...)`` returns the Starlette app
(for tests, or to mount it in another ASGI server). See docs/dashboard.md.
"""

from duetime.dashboard.app import create_app
from duetime.dashboard.security import check_exposure
from duetime.dashboard.server import serve

__all__ = ["check_exposure", "create_app", "serve"]
