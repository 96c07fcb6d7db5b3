"""The aws-burst judge: what a finder's plan would ask of AWS's quotas, second by second."""

import pytest

from tocsin.measure.aws_burst import StartedBatch, judge, through_bucket

DUE = 1_800_000_060.0


def test_a_bucket_serves_its_burst_at_once_then_at_its_rate():
    served = through_bucket([0.0] * 5, burst=3, rate=2)
    assert served[:3] == [0.0, 0.0, 0.0]
    assert served[3:] == pytest.approx([0.5, 1.0])


def burst_of(batches: int, tasks: int, wake_before_s: float) -> list[StartedBatch]:
    return [
        StartedBatch(DUE - 60, DUE - wake_before_s, DUE, DUE + 0.999, tasks) for _ in range(batches)
    ]


def test_claims_beyond_the_tables_rate_land_after_the_window():
    plan = burst_of(batches=10, tasks=500, wake_before_s=2)  # 5,000 claims in the lead
    cold = judge(plan, concurrency_budget=900, writes_per_second=1000)
    assert cold["all_woken_before_window"] and not cold["all_claimed_before_window"]
    # a second of writes at once, then 4,000 more at 1,000 a second: 2 s past the window
    assert cold["least_claim_margin_ms"] == pytest.approx(-2000, abs=5)
    assert cold["peak_writes_per_second"] == 5000
    warm = judge(plan, concurrency_budget=900, writes_per_second=4000)
    assert warm["all_claimed_before_window"] and warm["least_claim_margin_ms"] > 0
    assert (warm["transitions"], warm["peak_concurrency"]) == (20, 10)


def test_more_environments_than_the_budget_are_not_woken_in_time():
    plan = burst_of(batches=901, tasks=1, wake_before_s=2)
    assert not judge(plan, concurrency_budget=900, writes_per_second=4000)[
        "all_woken_before_window"
    ]
    assert judge(plan, concurrency_budget=950, writes_per_second=4000)["all_woken_before_window"]


def test_a_start_after_its_wake_is_not_in_time():
    late = [StartedBatch(DUE - 1, DUE - 2, DUE, DUE, 1)]
    figures = judge(late, concurrency_budget=900, writes_per_second=4000)
    assert not figures["all_started_before_wake"] and not figures["all_woken_before_window"]
