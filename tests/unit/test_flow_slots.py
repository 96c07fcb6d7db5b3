"""A flow's rate as slots: none before its task's due time, none closer than 1/rate."""

from tocsin.flow import slots


def test_tasks_due_together_are_spaced_by_the_rate_the_first_at_its_due_time():
    planned, free_us = slots([1000, 1000, 1000, 1000], 0, rate=4)
    assert planned == [1000, 1250, 1500, 1750]
    assert free_us == 2_000_000


def test_a_task_due_after_the_free_slot_keeps_its_due_time():
    planned, _ = slots([1000, 5000], 0, rate=1)
    assert planned == [1000, 5000]


def test_the_ledger_s_free_slot_holds_back_a_task_due_before_it():
    """Another invocation took the slots up to 1.5 s: this one's tasks follow them."""
    planned, free_us = slots([1000, 1000], 1_500_000, rate=2)
    assert planned == [1500, 2000]
    assert free_us == 2_500_000


def test_a_slot_between_milliseconds_is_rounded_up_never_down():
    planned, _ = slots([0, 0, 0, 0], 0, rate=3)  # 333.334 ms apart
    assert planned == [0, 334, 667, 1001]
