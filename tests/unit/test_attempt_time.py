"""An executor starts no attempt that could outlast its invocation: Lambda kills an
invocation at its timeout, and an attempt killed after it acted leaves no record, so the
retried invocation would act again. Each attempt may take its target's `attempt_limit_s`."""

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from tocsin import clock
from tocsin.errors import TransientTargetError
from tocsin.fire import wire
from tocsin.fire.batch import ClaimedTask, Later
from tocsin.fire.sends import NoTimeToSend, fire
from tocsin.retry import RetryPolicy
from tocsin.targets.base import Delivery, Target

LIMIT_S = 1.0


class SlowTarget(Target):
    """A target the network keeps failing, whose one send may take LIMIT_S."""

    sends: ClassVar[list[int]] = []

    @property
    def attempt_limit_s(self) -> float:
        return LIMIT_S

    def send(self, delivery: Delivery, turn: wire.Turn = wire.NOW) -> dict[str, Any]:
        turn.at_gate()  # as a send's request waits for its turn
        self.sends.append(clock.now_ms())
        raise TransientTargetError("503")


@pytest.fixture(autouse=True)
def no_sends_yet() -> Iterator[None]:
    SlowTarget.sends.clear()
    yield
    SlowTarget.sends.clear()


def task(task_id: str, due_ms: int) -> ClaimedTask:
    policy = RetryPolicy(max_attempts=5, min_backoff_s=0.5)
    return ClaimedTask(task_id, 1, due_ms, SlowTarget(), b"{}", policy, first_due_ms=due_ms)


def test_no_attempt_starts_that_could_end_after_the_deadline():
    """A task never tried fails its invocation, for Fire to retry with a fresh one: it is
    not failed for good untried."""
    now = clock.now_ms()
    with pytest.raises(NoTimeToSend):
        fire([task("late-gate", now)], deadline_ms=now + int(LIMIT_S * 1000) - 300)
    assert SlowTarget.sends == []


def test_retries_in_the_invocation_stop_when_the_next_attempt_could_not_end_in_time():
    """Backoffs of 0.5, 1 and 2 s (each up to a quarter longer) with 1 s attempts: a third
    attempt starts by 1.9 s and could end by 2.9 s; a fourth could not end before 4.5 s,
    past the 4 s deadline. The task goes RETRYING, due at that fourth attempt."""
    now = clock.now_ms()
    [outcome] = fire([task("flaky", now)], deadline_ms=now + 4000)
    assert isinstance(outcome, Later) and outcome.attempts == 3
    assert outcome.next_ms + LIMIT_S * 1000 > now + 4000
    assert [t["error"] for t in outcome.tries] == ["503"] * 3
    assert len(SlowTarget.sends) == 3
    assert SlowTarget.sends[-1] + LIMIT_S * 1000 <= now + 4000
