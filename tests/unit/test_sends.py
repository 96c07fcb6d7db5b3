"""A batch's tasks go out in calls: ten at most, 256 KiB at most, one millisecond and one
queue, topic or bus each; a task of another type, or one that cannot be fired, alone."""

import json

from tocsin.fire.batch import BatchTask, ClaimedTask, Failed, Held
from tocsin.fire.sends import sends
from tocsin.retry import RetryPolicy
from tocsin.targets.sqs import SqsTarget
from tocsin.targets.webhook import WebhookTarget

DUE = 1_800_000_000_000
QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/{}"


def held(task_id: str, target, due_ms: int = DUE, payload_bytes: int = 10) -> Held:
    payload = json.dumps("x" * payload_bytes)
    task = ClaimedTask(task_id, 1, due_ms, target, payload.encode(), RetryPolicy(), due_ms)
    return Held(BatchTask(task_id=task_id, version=1, due_ms=due_ms), task, held_before=False)


def ids(calls: list[list[Held]]) -> list[list[str]]:
    return [[each.asked.task_id for each in call] for call in calls]


def test_one_queues_tasks_due_in_one_millisecond_go_ten_to_a_call_in_the_batchs_order():
    queue = SqsTarget(queue_url=QUEUE.format("orders"))
    calls = sends([held(f"t{i:02d}", queue) for i in range(23)])
    assert [len(call) for call in calls] == [10, 10, 3]
    assert [task_id for call in ids(calls) for task_id in call] == [f"t{i:02d}" for i in range(23)]


def test_another_queue_or_millisecond_is_another_call():
    orders, refunds = (SqsTarget(queue_url=QUEUE.format(name)) for name in ("orders", "refunds"))
    batch = [held("a", orders), held("b", refunds), held("c", orders), held("d", orders, DUE + 1)]
    assert ids(sends(batch)) == [["a", "c"], ["b"], ["d"]]


def test_a_call_holds_at_most_256_kib_of_entries():
    queue = SqsTarget(queue_url=QUEUE.format("bodies"))
    body = 100 * 1024  # two fit in a call's 256 KiB, a third would not
    calls = sends([held(f"t{i}", queue, payload_bytes=body) for i in range(5)])
    assert ids(calls) == [["t0", "t1"], ["t2", "t3"], ["t4"]]


def test_a_webhook_task_and_a_task_that_cannot_be_fired_go_alone():
    hook = WebhookTarget(url="https://example.com/hook")
    queue = SqsTarget(queue_url=QUEUE.format("orders"))
    broken = Held(BatchTask(task_id="broken", version=1, due_ms=DUE), Failed("E", "c", 0), False)
    calls = sends(
        [held("w1", hook), held("w2", hook), broken, held("q1", queue), held("q2", queue)]
    )
    assert ids(calls) == [["w1"], ["w2"], ["broken"], ["q1", "q2"]]
