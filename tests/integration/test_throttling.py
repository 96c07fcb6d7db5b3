"""StartExecution throttling: botocore backs off and retries; what still fails waits, PENDING."""

from collections.abc import Callable
from typing import Any

import pytest
from moto.core.exceptions import JsonRESTError
from moto.stepfunctions.parser.models import StepFunctionsParserBackend

from tests.conftest import store_task, stored, webhook_task
from tocsin import clock


def throttle(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """Step Functions answers ThrottlingException `times` times, as past its token bucket."""
    calls: list[int] = []
    start: Callable[..., Any] = StepFunctionsParserBackend.start_execution

    def throttled(backend: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= times:
            raise JsonRESTError("ThrottlingException", "Rate exceeded")
        return start(backend, *args, **kwargs)

    monkeypatch.setattr(StepFunctionsParserBackend, "start_execution", throttled)
    return calls


def pending_task(task_id: str, receiver_url: str) -> None:
    store_task(webhook_task(receiver_url, clock.now_ms() + 15_000, task_id))


def test_throttled_starts_are_retried_with_backoff(runtime, receiver, monkeypatch, no_backoff):
    pending_task("busy", receiver.url)
    calls = throttle(monkeypatch, times=2)
    report = runtime.run_finder()
    assert report["started"] == 1 and report["throttled"] == 0
    assert len(calls) == 3
    assert [e.name for e in runtime.executions()] == ["busy-v1"]


def test_a_start_throttled_beyond_retries_stays_pending_for_the_next_run(
    runtime, receiver, monkeypatch, no_backoff
):
    pending_task("jammed", receiver.url)
    calls = throttle(monkeypatch, times=99)
    report = runtime.run_finder()
    assert report["throttled"] == 1 and report["backlog"] == 1
    assert len(calls) == 5  # the first call and four retries, then it gives up for this run
    assert stored("jammed")["status"] == "PENDING"
    assert "gsi_pk" in stored("jammed")  # still in the due index
    assert list(runtime.executions()) == []
    monkeypatch.undo()
    assert runtime.run_finder()["started"] == 1
