"""A crowded second's tasks are packed by the calls they will make (`tocsin.call_keys`),
their targets read from the Tasks table and from the Bodies table: run on DynamoDB Local too
(`make test`'s store-heavy group), which checks the reads' expressions as AWS does."""

from tests.conftest import store_task, stored, wait_for_status
from tests.integration.test_targets import drain, queue
from tocsin import clock
from tocsin.bodies import INLINE_BYTES


def test_the_finder_packs_a_crowded_millisecond_by_the_queues_its_tasks_go_to(runtime):
    """40 SQS tasks due in one millisecond at 40 queues go out in 40 calls, which one
    executor's burst (60 sends, a call counting two) cannot hold: the finder reads their
    targets, one of them in a body apart, and starts two executions. 40 due in another
    second at one queue are four calls: one execution (review F5)."""
    second = (clock.now_ms() + 8000) // 1000 * 1000
    urls = [queue(f"crowded-{i}")[0] for i in range(40)]
    shared, _ = queue("shared")
    for i, url in enumerate(urls):
        payload = {"blob": "x" * INLINE_BYTES} if i == 7 else {"i": i}
        store_task(
            {
                "id": f"many-{i}",
                "due_at": clock.to_iso(second),
                "type": "sqs",
                "target": {"queue_url": url},
                "payload": payload,
            }
        )
        store_task(
            {
                "id": f"one-{i}",
                "due_at": clock.to_iso(second + 1000),
                "type": "sqs",
                "target": {"queue_url": shared},
                "payload": {"i": i},
            }
        )
    assert "body" in stored("many-7")  # its target read from the Bodies table
    report = runtime.run_finder()
    assert (report["found"], report["started"], report["executions"]) == (80, 80, 3)
    for i in range(40):
        wait_for_status(f"many-{i}", {"SUCCEEDED"})
        wait_for_status(f"one-{i}", {"SUCCEEDED"})
    executions = {stored(f"{kind}-{i}")["execution"] for kind in ("many", "one") for i in range(40)}
    assert len(executions) == 3
    assert [len(drain(url)) for url in urls] == [1] * 40
