"""An app for process tests whose worker cannot work: importing it breaks the claim
step of every worker in the process (as a bug in duetime or a broken dependency
would), so the test can watch the process give up and exit non-zero instead of
staying up, heartbeating, without working."""

from __future__ import annotations

from typing import Any, NoReturn

import duetime
from duetime.store.plans.working import WorkerPlans

app = duetime.App()


@app.default
def record(data: Any) -> None:
    del data


def _broken_claim(self: WorkerPlans, *args: Any, **kwargs: Any) -> NoReturn:
    del self, args, kwargs
    raise ValueError("claim is broken in this process")


WorkerPlans.claim = _broken_claim  # type: ignore[method-assign]
