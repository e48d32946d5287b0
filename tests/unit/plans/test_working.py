"""The worker's plans (store/plans/working.py), without a server: each script called with
its keys in the order its header lists them and its arguments from the inputs (lease
deadlines and retry times from the server's now, a retry told from a death by -1); a
claim's flat sextuples read into Claimed items, a paused queue told from an empty claim;
a heartbeat's reply read; acks of many outcomes packed into one argument, with result
keys only for the results kept, and waiting for replicas when asked."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from duetime import codec
from duetime.errors import NotDurableError
from duetime.store.plans import scripts
from duetime.store.plans.history import SUCCEEDED_CODE
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.requests import Command, Durability, Durably, Eval, Request
from duetime.store.plans.working import Claimed, Ended, HeartbeatReply, Outcome, WorkerPlans
from tests.unit.plans.scripted import NOW_MS, run_plan

# --- taking ids and waiting ------------------------------------------------------------


def test_take_ready_blocks_moving_an_id_into_the_workers_list(
    worker: WorkerPlans, keys: QueueKeys
) -> None:
    blmove = Command(("BLMOVE", keys.ready, keys.active("w1"), "LEFT", "RIGHT", 1.5), block=1.5)
    assert run_plan(worker.take_ready("w1", 1.5), (blmove, None)) is None
    assert run_plan(worker.take_ready("w1", 1.5), (blmove, b"t1")) == "t1"
    # An id that is not UTF-8 (written by hand) reads so that it is written back the same.
    taken = run_plan(worker.take_ready("w1", 1.5), (blmove, b"t\xff"))
    assert taken is not None and taken.encode("utf-8", "surrogateescape") == b"t\xff"


def test_wait_resumed_blocks_on_the_resumed_list_leaving_its_element(
    worker: WorkerPlans, keys: QueueKeys
) -> None:
    blmove = Command(("BLMOVE", keys.resumed, keys.resumed, "LEFT", "LEFT", 3), block=3)
    assert run_plan(worker.wait_resumed(3), (blmove, None)) is False
    assert run_plan(worker.wait_resumed(3), (blmove, b"1")) is True


def test_give_back_names_the_id_now_and_worker(worker: WorkerPlans, keys: QueueKeys) -> None:
    k = keys
    give_back = Eval(
        scripts.GIVE_BACK_TASK,
        [k.active("w1"), k.ready, k.tasks, k.stats, k.cancelling, k.attempts, k.errors,
         k.early, k.flow_records, *k.history_keys],
        ["t1", NOW_MS, "w1"],
    )  # fmt: skip
    assert run_plan(worker.give_back("w1", "t1"), (give_back, 1)) is True
    assert run_plan(worker.give_back("w1", "t1"), (give_back, 0)) is False


# --- claim -----------------------------------------------------------------------------


def claim_keys(keys: QueueKeys, worker_id: str) -> list[str]:
    """claim_tasks.lua's KEYS, as its header lists them."""
    k = keys
    return [k.ready, k.active(worker_id), k.leases, k.attempts, k.tasks, k.workers, k.early,
            k.paused, k.stats, *k.flow_keys, k.wake, k.flow_holds]  # fmt: skip


def test_a_claim_leases_until_now_plus_the_lease_and_names_the_ids_taken(
    worker: WorkerPlans, keys: QueueKeys
) -> None:
    claim = Eval(
        scripts.CLAIM_TASKS, claim_keys(keys, "w1"), [NOW_MS, NOW_MS + 30_000, "w1", 8, "a", "b"]
    )
    assert run_plan(worker.claim("w1", 30_000, 8, ["a", "b"]), (claim, [])) == []


def test_a_claims_sextuples_are_read_into_items(worker: WorkerPlans, keys: QueueKeys) -> None:
    reply = [
        b"a", 3, b"env-a", None, None, None,  # a plain task
        b"gone", 0, None, None, None, None,  # no envelope: dropped by the script
        b"early", 1, b"env-e", b"1800000000500.5", None, b"1800000000250",
        b"bad", 2, b"env-b", b"-1", b"attempts is not a number", b"-1",
    ]  # fmt: skip
    claimed = run_plan(
        worker.claim("w1", 1000, 4),
        (Eval(scripts.CLAIM_TASKS, claim_keys(keys, "w1"), [NOW_MS, NOW_MS + 1000, "w1", 4]),
         reply),
    )  # fmt: skip
    assert claimed == [
        Claimed("a", 3, b"env-a"),
        Claimed("gone", 0, None),
        Claimed("early", 1, b"env-e", early_run_at_ms=1800000000500.5,
                held_until_ms=1800000000250),
        Claimed("bad", 2, b"env-b", problem="attempts is not a number"),
    ]  # fmt: skip


def test_a_paused_queue_claims_nothing_unlike_an_empty_ready_list(
    worker: WorkerPlans, keys: QueueKeys
) -> None:
    claim = Eval(scripts.CLAIM_TASKS, claim_keys(keys, "w1"), [NOW_MS, NOW_MS + 1000, "w1", 1])
    assert run_plan(worker.claim("w1", 1000, 1), (claim, b"paused")) is None
    assert run_plan(worker.claim("w1", 1000, 1), (claim, [])) == []


# --- heartbeat -------------------------------------------------------------------------


def test_a_heartbeat_renews_each_running_attempt_and_counts_the_fenced(
    worker: WorkerPlans, keys: QueueKeys
) -> None:
    k = keys
    beat = Eval(
        scripts.HEARTBEAT,
        [k.workers, k.leases, k.attempts, k.active("w1"), k.stats, k.cancelling],
        [NOW_MS, NOW_MS + 20_000, "w1", 2, "a", 3, "b", 1],
    )
    found = run_plan(
        worker.heartbeat("w1", 20_000, [("a", 3), ("b", 1)], fenced_outcomes=2),
        (beat, [1, [b"b", 1], [b"a", b"b", b"c"], [b"a"]]),
    )
    assert found == HeartbeatReply(
        was_registered=True, lost=[("b", 1)], held=["a", "b", "c"], cancelling=["a"]
    )


def test_a_heartbeat_of_a_worker_taken_for_dead_says_so(
    worker: WorkerPlans, keys: QueueKeys
) -> None:
    def beat(request: Request) -> None:
        assert isinstance(request, Eval) and request.script == scripts.HEARTBEAT
        assert list(request.args) == [NOW_MS, NOW_MS + 5000, "w1", 0]  # nothing running

    found = run_plan(worker.heartbeat("w1", 5000, []), (beat, [0, [b"a", 2, b"b", 7], [], []]))
    assert not found.was_registered
    assert found.lost == [("a", 2), ("b", 7)] and found.held == []


# --- ack -------------------------------------------------------------------------------


def ack_keys(keys: QueueKeys, worker_id: str, *results: str) -> list[str]:
    """ack_tasks.lua's KEYS, as its header lists them: a result key per result kept, last."""
    k = keys
    return [k.active(worker_id), k.leases, k.attempts, k.tasks, k.errors, k.stats, k.minutes,
            *k.flow_keys, k.wake, k.ready, *k.history_keys, k.cancelling, k.flow_holds,
            *(k.result(task_id) for task_id in results)]  # fmt: skip


def sextets(packed: Any) -> list[list[Any]]:
    """ack_tasks' packed argument (strings as the bytes Lua sees), six fields an outcome."""
    flat = msgpack.unpackb(packed, raw=True)
    assert len(flat) % 6 == 0
    return [flat[i : i + 6] for i in range(0, len(flat), 6)]


def test_an_ack_packs_every_outcome_into_one_argument_with_its_history_record(
    worker: WorkerPlans, keys: QueueKeys
) -> None:
    outcomes = [
        Outcome("a", 2, result_ttl_ms=60_000, result=b"ra", lateness_us=40, duration_us=900,
                task="send"),
        Outcome("b", 1, lateness_us=-3, duration_us=-1, task="mail"),  # no result kept
        Outcome("c", 5, result_ttl_ms=1, result=b"rc"),
    ]  # fmt: skip
    sent: list[Any] = []

    def ack(request: Request) -> None:
        assert isinstance(request, Eval) and request.script == scripts.ACK_TASKS
        # A result key for each result kept, in the order of the outcomes.
        assert list(request.keys) == ack_keys(keys, "w1", "a", "c")
        now, worker_id, packed = request.args  # no 4th: nothing was held
        assert (now, worker_id) == (NOW_MS, "w1")
        sent.extend(sextets(packed))

    ended = run_plan(worker.ack("w1", outcomes), (ack, [1, 0, 2]))
    assert ended == [Ended.APPLIED, Ended.FENCED, Ended.CANCELLED]
    assert [row[:5] for row in sent] == [
        [b"a", 2, 60_000, b"ra", 40],
        [b"b", 1, 0, b"", -3],
        [b"c", 5, 1, b"rc", 0],
    ]
    records = [codec.unpack_written_by_lua(row[5]) for row in sent]
    assert records[0] == ["a", "send", SUCCEEDED_CODE, 2, NOW_MS, "w1", 900, 40]
    # The history keeps no negative duration or lateness (a clock step), whatever the ack.
    assert records[1] == ["b", "mail", SUCCEEDED_CODE, 1, NOW_MS, "w1", 0, 0]


def test_an_ack_sends_how_long_each_was_held_only_when_one_was(
    worker: WorkerPlans, keys: QueueKeys
) -> None:
    def ack(request: Request) -> None:
        assert isinstance(request, Eval)
        assert len(request.args) == 4
        assert msgpack.unpackb(request.args[3]) == [0, 750]  # one per outcome, in order

    outcomes = [Outcome("a", 1), Outcome("b", 1, held_us=750)]
    assert run_plan(worker.ack("w1", outcomes), (ack, [1, 1])) == [Ended.APPLIED] * 2


def test_an_ack_sends_an_id_that_is_not_utf8_as_its_bytes(
    worker: WorkerPlans, keys: QueueKeys
) -> None:
    task_id = b"t\xff".decode("utf-8", "surrogateescape")  # as take_ready read it

    def ack(request: Request) -> None:
        assert isinstance(request, Eval)
        [row] = sextets(request.args[2])
        assert row[0] == b"t\xff"
        assert codec.unpack_written_by_lua(row[5])[0] == task_id

    assert run_plan(worker.ack("w1", [Outcome(task_id, 1)]), (ack, [1])) == [Ended.APPLIED]


def test_a_durable_ack_waits_for_the_replicas_and_raises_short_of_them(
    worker: WorkerPlans, keys: QueueKeys
) -> None:
    durability = Durability(replicas=2, timeout_ms=500)

    def durably(request: Request) -> None:
        assert isinstance(request, Durably) and request.durability == durability
        assert request.calls.script == scripts.ACK_TASKS
        [(call_keys, args)] = request.calls.calls  # one script call for them all
        assert list(call_keys) == ack_keys(keys, "w1")
        assert args[:2] == [NOW_MS, "w1"]

    outcomes = [Outcome("a", 1), Outcome("b", 4)]
    ended = run_plan(worker.ack("w1", outcomes, durability), (durably, ([[1, 0]], [2])))
    assert ended == [Ended.APPLIED, Ended.FENCED]
    with pytest.raises(NotDurableError) as raised:
        run_plan(worker.ack("w1", outcomes, durability), (durably, ([[1, 1]], [1])))
    assert raised.value.confirmed == 1 and raised.value.reply == [[1, 1]]


# --- fail, snooze, release -------------------------------------------------------------


def fail_keys(keys: QueueKeys, worker_id: str, task_id: str) -> list[str]:
    """fail_task.lua's KEYS, as its header lists them."""
    k = keys
    return [k.active(worker_id), k.leases, k.attempts, k.errors, k.scheduled, k.dead, k.wake,
            k.stats, k.result(task_id), k.minutes, k.early, *k.flow_keys, k.ready, k.tasks,
            *k.history_keys, k.cancelling]  # fmt: skip


def test_a_failure_to_retry_names_when_from_the_servers_now(
    worker: WorkerPlans, keys: QueueKeys
) -> None:
    fail = Eval(
        scripts.FAIL_TASK,
        fail_keys(keys, "w1", "t"),
        [NOW_MS, "w1", "t", 3, b"err", NOW_MS + 2500, 0, b"", 700, 30, "boom", ""],
    )
    ended = run_plan(
        worker.fail("w1", "t", 3, b"err", 2500, ran=(700, 30), summary="boom"), (fail, 1)
    )
    assert ended is Ended.APPLIED


@pytest.mark.parametrize(
    ("reply", "ended"), [(0, Ended.FENCED), (1, Ended.APPLIED), (2, Ended.CANCELLED)]
)
def test_a_failure_to_dead_sends_minus_one_and_keeps_the_result_asked(
    worker: WorkerPlans, keys: QueueKeys, reply: int, ended: Ended
) -> None:
    """No retry delay: dead (-1); a handler that never started ran -1 µs, -1 late."""
    fail = Eval(
        scripts.FAIL_TASK,
        fail_keys(keys, "w1", "t"),
        [NOW_MS, "w1", "t", 5, b"err", -1, 86_400_000, b"res", -1, -1, "", ""],
    )
    plan = worker.fail("w1", "t", 5, b"err", None, result_ttl_ms=86_400_000, result=b"res")
    assert run_plan(plan, (fail, reply)) is ended


def test_an_attempt_past_its_expiry_fails_as_expired(worker: WorkerPlans, keys: QueueKeys) -> None:
    fail = Eval(
        scripts.FAIL_TASK,
        fail_keys(keys, "w1", "t"),
        [NOW_MS, "w1", "t", 1, b"late", -1, 0, b"", -1, -1, "", "expired"],
    )
    plan = worker.fail("w1", "t", 1, b"late", None, expired=True)
    assert run_plan(plan, (fail, 3)) is Ended.EXPIRED


def snooze_keys(keys: QueueKeys, worker_id: str) -> list[str]:
    """snooze_task.lua's KEYS, as its header lists them."""
    k = keys
    return [k.active(worker_id), k.leases, k.attempts, k.scheduled, k.wake, k.stats, k.early,
            *k.flow_keys, k.ready, k.tasks, *k.history_keys, k.cancelling, k.errors]  # fmt: skip


@pytest.mark.parametrize(("whole_key", "flag"), [(True, 1), (False, 0)])
def test_a_snooze_waits_from_the_servers_now_and_says_whether_its_key_waits(
    worker: WorkerPlans, keys: QueueKeys, whole_key: bool, flag: int
) -> None:
    snooze = Eval(
        scripts.SNOOZE_TASK,
        snooze_keys(keys, "w1"),
        [NOW_MS, "w1", "t", 2, NOW_MS + 10_000, flag, 1200, 55],
    )
    plan = worker.snooze("w1", "t", 2, 10_000, whole_key, ran=(1200, 55))
    assert run_plan(plan, (snooze, 0)) is Ended.FENCED


def test_release_worker_looks_again_later_and_counts_what_went_back(
    worker: WorkerPlans, keys: QueueKeys
) -> None:
    k = keys
    release = Eval(
        scripts.RELEASE_WORKER,
        [k.workers, k.active("w1"), k.leases, k.attempts, k.ready, k.stats, k.reaped, k.tasks,
         k.early, *k.flow_keys, k.wake, k.cancelling, k.errors, *k.history_keys],
        # worker, when to look again, outcomes fenced, now: now comes last here.
        ["w1", NOW_MS + 4000, 3, NOW_MS],
    )  # fmt: skip
    assert run_plan(worker.release_worker("w1", 4000, fenced_outcomes=3), (release, 6)) == 6
