"""Task ids duetime makes: random, short, URL-safe; made in bulk for ``schedule_many``
and handed out from a pool for single calls.

Callers elsewhere call ``new_task_ids`` through this module rather than import the name,
so that a test that replaces it here (to make ids collide) reaches every caller.
"""

from __future__ import annotations

import base64
import os
from collections import deque
from typing import Final

#: Random bytes per generated id; 9 bytes encode to exactly 12 base64 characters.
_ID_BYTES = 9
_ID_LENGTH = 12
#: Rounds of fresh ids for generated ids that collided with live ones. One collision of
#: 72 random bits is already rare; this many in a row means something else is wrong.
MAX_ID_ROUNDS: Final = 8


def new_task_ids(count: int) -> list[str]:
    """Random ids of 12 URL-safe characters (72 bits): short, since every id is stored
    twice. A collision with a live id is detected and retried by ``schedule_plan``, so
    the ids only need to make collisions rare, not impossible. Made in bulk."""
    # "." and "_" for the two symbols: an id never starts with "-", which a command line
    # would take for an option.
    text = base64.b64encode(os.urandom(_ID_BYTES * count), altchars=b"._").decode()
    return [text[i : i + _ID_LENGTH] for i in range(0, _ID_LENGTH * count, _ID_LENGTH)]


#: Ids made ahead for single schedule calls: one urandom call per 256 ids instead of
#: one per call. deque.popleft is atomic, so threads share it safely; a forked child
#: empties it, or parent and child would hand out the same ids (caught as collisions,
#: but each costs a round trip).
_ID_POOL_SIZE = 256
_id_pool: deque[str] = deque()
os.register_at_fork(after_in_child=lambda: _id_pool.clear())


def new_task_id() -> str:
    """One id, as ``new_task_ids(1)`` would make it (handed out in the order made)."""
    while True:
        try:
            return _id_pool.popleft()
        except IndexError:
            _id_pool.extend(new_task_ids(_ID_POOL_SIZE))


def fresh_ids(count: int, taken: set[str]) -> list[str]:
    """``count`` new ids, none of them in ``taken`` or repeated."""
    fresh: list[str] = []
    while len(fresh) < count:
        for task_id in new_task_ids(count - len(fresh)):
            if task_id not in taken:
                taken.add(task_id)
                fresh.append(task_id)
    return fresh
