"""A flow's rate as slots: none before its task's due time, none closer than its spacing,
which keeps any second within the rate."""

from tocsin.flow import JITTER_MS, MAX_RATE, SLOT_SLACK_MS, slots, spacing_us


def test_the_spacing_leaves_a_second_room_for_a_late_send_and_jitter_within_the_rate():
    for rate in (1, 3, 4, 500, MAX_RATE):
        assert rate * spacing_us(rate) >= 1000 * (1000 + SLOT_SLACK_MS + JITTER_MS)
        assert (rate - 1) * spacing_us(rate) < 1000 * (1000 + SLOT_SLACK_MS + JITTER_MS)


def test_tasks_due_together_are_spaced_the_first_at_its_due_time():
    planned, free_us = slots([1000, 1000, 1000, 1000], 0, rate=4)  # 260 ms apart
    assert planned == [1000, 1260, 1520, 1780]
    assert free_us == 2_040_000


def test_a_task_due_after_the_free_slot_keeps_its_due_time():
    planned, _ = slots([1000, 5000], 0, rate=1)
    assert planned == [1000, 5000]


def test_the_ledger_s_free_slot_holds_back_a_task_due_before_it():
    """Another invocation took the slots up to 1.5 s: this one's tasks follow them."""
    planned, free_us = slots([1000, 1000], 1_500_000, rate=2)
    assert planned == [1500, 2020]
    assert free_us == 2_540_000


def test_a_slot_between_milliseconds_is_rounded_up_never_down():
    planned, _ = slots([0, 0, 0, 0], 0, rate=3)  # 346.667 ms apart
    assert planned == [0, 347, 694, 1041]
