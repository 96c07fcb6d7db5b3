"""A task's retry policy (`tocsin.retry`) and how the executor follows it (`fire`): the
backoff's bounds, the age limit, Retry-After in both forms, a throttling answer that
counts no attempt, and a failure for good that stops at once."""

import random
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from tocsin import clock
from tocsin.errors import PermanentTargetError, TransientTargetError
from tocsin.fire import wire
from tocsin.fire.batch import ClaimedTask, Failed, Later
from tocsin.fire.sends import fire
from tocsin.retry import (
    JITTER,
    ExhaustedBy,
    RetryPolicy,
    given_policy,
    rate_limit_reset_s,
    retry_after_s,
)
from tocsin.targets.base import Delivery, Target

NOW_MS = 1_800_000_000_000


def test_the_backoff_doubles_from_its_least_to_its_most_and_never_leaves_them():
    policy = RetryPolicy(min_backoff_s=2, max_backoff_s=60)
    rng = random.Random(5)
    for failures in range(1, 40):
        base = min(60, 2 * 2 ** (failures - 1))
        pause = policy.backoff_s(failures, rng)
        assert base <= pause <= min(60, base * (1 + JITTER)), failures
    pauses = {round(policy.backoff_s(3, rng), 3) for _ in range(20)}
    assert len(pauses) > 10  # jittered: tasks that failed together come back apart


def test_a_policy_out_of_bounds_is_refused_naming_its_field():
    for field, value in [
        ("max_attempts", 186),
        ("max_age_s", 59),
        ("min_backoff_s", 0.4),
        ("max_backoff_s", 86_401),
    ]:
        with pytest.raises(ValidationError) as refused:
            RetryPolicy.model_validate({field: value})
        assert refused.value.errors()[0]["loc"] == (field,)
    with pytest.raises(ValidationError, match="max_backoff_s must be at least"):
        RetryPolicy(min_backoff_s=10, max_backoff_s=5)


def test_the_top_level_max_attempts_is_the_policys_and_may_not_disagree_with_it():
    assert given_policy(None, 7).max_attempts == 7
    assert given_policy(RetryPolicy(max_age_s=600), 7) == RetryPolicy(max_attempts=7, max_age_s=600)
    assert given_policy(RetryPolicy(max_attempts=7), 7).max_attempts == 7
    with pytest.raises(ValueError, match="max_attempts"):
        given_policy(RetryPolicy(max_attempts=3), 7)


def test_retry_after_in_seconds_or_as_an_http_date():
    assert retry_after_s("120", NOW_MS) == 120
    in_90_s = clock.to_datetime(NOW_MS + 90_000).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert retry_after_s(in_90_s, NOW_MS) == 90
    assert retry_after_s("Thu, 01 Jan 2015 00:00:00 GMT", NOW_MS) == 0  # past: at once
    assert retry_after_s("soon", NOW_MS) is None
    assert rate_limit_reset_s("30", NOW_MS) == 30
    assert rate_limit_reset_s(str(NOW_MS // 1000 + 45), NOW_MS) == 45


class Answering(Target):
    """A target that raises what it is scripted to, an attempt at a time, then answers."""

    script: ClassVar[list[Exception]] = []
    attempts: ClassVar[list[int]] = []

    @property
    def attempt_limit_s(self) -> float:
        return 0.2

    def send(self, delivery: Delivery, turn: wire.Turn = wire.NOW) -> dict[str, Any]:
        turn.at_gate()
        self.attempts.append(delivery.attempt)
        if self.script:
            raise self.script.pop(0)
        return {"status": 200}


def fired(script: list[Exception], policy: RetryPolicy, **task: Any) -> Any:
    Answering.script, Answering.attempts = list(script), []
    now = clock.now_ms()
    given = {"first_due_ms": now} | task
    claimed = ClaimedTask("t", 1, now, Answering(), b"{}", policy, **given)
    [outcome] = fire([claimed], deadline_ms=now + 60_000)
    return outcome


FAST = RetryPolicy(min_backoff_s=0.5, max_backoff_s=1)


def test_each_attempt_is_numbered_and_the_count_goes_on_from_an_earlier_invocation():
    outcome = fired([TransientTargetError("503")], FAST, attempts_before=4)
    assert Answering.attempts == [5, 6]
    assert outcome.attempts == 6 and len(outcome.tries) == 1


def test_attempts_stop_at_the_policys_count_and_say_so():
    policy = FAST.model_copy(update={"max_attempts": 2})
    outcome = fired([TransientTargetError("503")] * 3, policy)
    assert isinstance(outcome, Failed) and outcome.exhausted_by is ExhaustedBy.ATTEMPTS
    assert outcome.attempts == 2 == len(Answering.attempts)


def test_a_throttling_answer_counts_towards_the_age_but_not_the_attempts():
    policy = FAST.model_copy(update={"max_attempts": 2})
    throttled = TransientTargetError("429", after_s=0.5, throttled=True)
    outcome = fired([throttled, throttled, TransientTargetError("503")], policy)
    assert outcome.result == {"status": 200}  # three failures, two of them throttling
    assert Answering.attempts == [1, 2, 3, 4]


def test_retry_after_sets_the_next_attempt_and_one_past_the_age_ends_the_task():
    later = fired([TransientTargetError("503", after_s=600)], FAST)
    assert isinstance(later, Later)
    assert later.next_ms - clock.now_ms() == pytest.approx(600_000, abs=1000)
    policy = FAST.model_copy(update={"max_age_s": 300})
    aged = fired([TransientTargetError("503", after_s=600)], policy)
    assert isinstance(aged, Failed) and aged.exhausted_by is ExhaustedBy.AGE
    assert len(Answering.attempts) == 1


def test_a_backoff_longer_than_a_short_pause_goes_back_retrying():
    policy = RetryPolicy(min_backoff_s=30)
    later = fired([TransientTargetError("503")], policy)
    assert isinstance(later, Later) and later.attempts == 1 and later.throttled == 0
    assert 30_000 <= later.next_ms - clock.now_ms() <= 30_000 * (1 + JITTER) + 100


def test_a_failure_for_good_stops_at_once():
    outcome = fired([PermanentTargetError("410"), TransientTargetError("503")], FAST)
    assert isinstance(outcome, Failed) and outcome.exhausted_by is ExhaustedBy.PERMANENT
    assert Answering.attempts == [1]
