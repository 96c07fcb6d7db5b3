"""Schedule expressions: EventBridge's documented cron examples, L/W/#, leap years and month
ends, rate and at, and the daylight-saving days of three zones, computed by hand in UTC."""

from datetime import datetime

import pytest

from tocsin import clock
from tocsin.errors import InvalidSchedule
from tocsin.recurrence import Occurrences, parse


def ms(text: str) -> int:
    return clock.to_ms(datetime.fromisoformat(text))


def upcoming(expression: str, after: str, count: int, timezone: str = "UTC") -> list[str]:
    rule = parse(expression, timezone, anchor_ms=ms(after))
    return [clock.to_iso(m) for m in Occurrences(rule).upcoming(ms(after), count)]


# EventBridge's cron reference, "Examples" (all in UTC). 2026-11-25 is a Wednesday.
@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("cron(0 10 * * ? *)", ["2026-11-25T10:00:00.000Z", "2026-11-26T10:00:00.000Z"]),
        ("cron(15 12 * * ? *)", ["2026-11-25T12:15:00.000Z", "2026-11-26T12:15:00.000Z"]),
        (  # Monday to Friday at 6 PM: Friday, then Monday
            "cron(0 18 ? * MON-FRI *)",
            [
                "2026-11-25T18:00:00.000Z",
                "2026-11-26T18:00:00.000Z",
                "2026-11-27T18:00:00.000Z",
                "2026-11-30T18:00:00.000Z",
            ],
        ),
        ("cron(0 8 1 * ? *)", ["2026-12-01T08:00:00.000Z", "2027-01-01T08:00:00.000Z"]),
        ("cron(0/15 * * * ? *)", ["2026-11-25T09:15:00.000Z", "2026-11-25T09:30:00.000Z"]),
        (  # every 10 minutes on weekdays: Friday's last, then Monday's first
            "cron(0/10 * ? * MON-FRI *)",
            ["2026-11-25T09:10:00.000Z", "2026-11-25T09:20:00.000Z"],
        ),
        (
            "cron(0/5 8-17 ? * MON-FRI *)",
            ["2026-11-25T09:05:00.000Z", "2026-11-25T09:10:00.000Z"],
        ),
        ("cron(0 9 ? * 2#1 *)", ["2026-12-07T09:00:00.000Z", "2027-01-04T09:00:00.000Z"]),
    ],
)
def test_eventbridge_examples(expression: str, expected: list[str]) -> None:
    assert upcoming(expression, "2026-11-25T09:00:00Z", len(expected)) == expected


def test_an_occurrence_at_the_instant_asked_from_is_included() -> None:
    rule = Occurrences(parse("cron(0 10 * * ? *)", "UTC", anchor_ms=0))
    assert rule.first_from(ms("2026-11-25T10:00:00Z")) == ms("2026-11-25T10:00:00Z")
    assert rule.first_from(ms("2026-11-25T10:00:00.001Z")) == ms("2026-11-26T10:00:00Z")


def test_weekdays_end_on_friday_evening() -> None:
    assert upcoming("cron(0/5 8-17 ? * MON-FRI *)", "2026-11-27T17:50:00Z", 2) == [
        "2026-11-27T17:55:00.000Z",
        "2026-11-30T08:00:00.000Z",
    ]


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        # L: the last day of each month, a leap February included
        ("cron(0 0 L * ? *)", "2028-01-15T00:00:00Z", ["2028-01-31", "2028-02-29", "2028-03-31"]),
        ("cron(0 0 L * ? *)", "2027-02-01T00:00:00Z", ["2027-02-28", "2027-03-31"]),
        # the 29th of February only in leap years; the 31st only in long months
        ("cron(0 0 29 2 ? *)", "2026-11-25T00:00:00Z", ["2028-02-29", "2032-02-29"]),
        ("cron(0 0 31 * ? *)", "2026-11-25T00:00:00Z", ["2026-12-31", "2027-01-31", "2027-03-31"]),
        # W: the weekday nearest the 15th (Saturday 15 August: Friday; Sunday 15 Nov: Monday)
        ("cron(0 12 15W 8,11 ? *)", "2026-08-01T00:00:00Z", ["2026-08-14", "2026-11-16"]),
        # 1W on Saturday 1 August stays in August: Monday the 3rd
        ("cron(0 12 1W 8 ? *)", "2026-07-01T00:00:00Z", ["2026-08-03"]),
        # 6L: the last Friday; L alone in day-of-week: Saturday
        ("cron(0 9 ? * 6L *)", "2026-11-01T00:00:00Z", ["2026-11-27", "2026-12-25"]),
        ("cron(0 9 ? * L *)", "2026-11-25T00:00:00Z", ["2026-11-28", "2026-12-05"]),
        # 3#2: the second Tuesday; names in month and day-of-week
        ("cron(0 9 ? JAN,JUL 3#2 *)", "2026-11-25T00:00:00Z", ["2027-01-12", "2027-07-13"]),
        # a year range ends the schedule
        ("cron(0 0 1 1 ? 2027-2028)", "2026-11-25T00:00:00Z", ["2027-01-01", "2028-01-01"]),
    ],
)
def test_calendar_wildcards(expression: str, after: str, expected: list[str]) -> None:
    found = upcoming(expression, after, len(expected) + 1)
    assert [moment[:10] for moment in found[: len(expected)]] == expected
    if "2027-2028" in expression:
        assert len(found) == 2  # nothing after the last year


# Hand-computed. New York 2026: clocks go 02:00 -> 03:00 on 8 March and 02:00 -> 01:00 on
# 1 November. Berlin: 02:00 -> 03:00 on 29 March, 03:00 -> 02:00 on 25 October. Lord Howe
# (+10:30, +11:00 in summer): 02:00 -> 02:30 on 4 October, 02:00 -> 01:30 on 5 April.
@pytest.mark.parametrize(
    ("expression", "timezone", "after", "expected"),
    [
        # 02:30 does not exist on 8 March in New York: skipped
        (
            "cron(30 2 * * ? *)",
            "America/New_York",
            "2026-03-07T00:00:00Z",
            ["2026-03-07T07:30:00.000Z", "2026-03-09T06:30:00.000Z"],
        ),
        # 01:30 happens twice on 1 November: fired once, at the first
        (
            "cron(30 1 * * ? *)",
            "America/New_York",
            "2026-10-31T12:00:00Z",
            ["2026-11-01T05:30:00.000Z", "2026-11-02T06:30:00.000Z"],
        ),
        # every half hour through the fall back: the repeated 01:00 and 01:30 fire once
        (
            "cron(0/30 * * * ? *)",
            "America/New_York",
            "2026-11-01T04:00:00Z",
            [
                "2026-11-01T04:30:00.000Z",
                "2026-11-01T05:00:00.000Z",
                "2026-11-01T05:30:00.000Z",
                "2026-11-01T07:00:00.000Z",
            ],
        ),
        # weekdays at 09:00 Berlin time: 08:00Z before the change, 07:00Z after
        (
            "cron(0 9 ? * MON-FRI *)",
            "Europe/Berlin",
            "2026-03-27T00:00:00Z",
            ["2026-03-27T08:00:00.000Z", "2026-03-30T07:00:00.000Z"],
        ),
        (
            "cron(30 2 * * ? *)",
            "Europe/Berlin",
            "2026-03-28T00:00:00Z",
            ["2026-03-28T01:30:00.000Z", "2026-03-30T00:30:00.000Z"],
        ),
        (
            "cron(30 2 * * ? *)",
            "Europe/Berlin",
            "2026-10-24T12:00:00Z",
            ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"],
        ),
        # Lord Howe springs forward by 30 minutes: 02:00 and 02:15 do not exist
        (
            "cron(0/15 * * * ? *)",
            "Australia/Lord_Howe",
            "2026-10-03T15:00:00Z",
            ["2026-10-03T15:15:00.000Z", "2026-10-03T15:30:00.000Z", "2026-10-03T15:45:00.000Z"],
        ),
        # and falls back by 30: the repeated 01:30 and 01:45 fire once, then 02:00 (+10:30)
        (
            "cron(0/15 * * * ? *)",
            "Australia/Lord_Howe",
            "2026-04-04T14:00:00Z",
            [
                "2026-04-04T14:15:00.000Z",
                "2026-04-04T14:30:00.000Z",
                "2026-04-04T14:45:00.000Z",
                "2026-04-04T15:30:00.000Z",
            ],
        ),
    ],
)
def test_daylight_saving(expression: str, timezone: str, after: str, expected: list[str]) -> None:
    assert upcoming(expression, after, len(expected), timezone) == expected


def test_an_occurrence_inside_the_repeated_hour_is_not_fired_again() -> None:
    """Asked from the second 01:15 of New York's fall back, the first 01:30 is past."""
    assert upcoming("cron(30 1 * * ? *)", "2026-11-01T06:15:00Z", 1, "America/New_York") == [
        "2026-11-02T06:30:00.000Z"
    ]


def test_rate_counts_fixed_intervals_from_its_anchor() -> None:
    assert upcoming("rate(2 seconds)", "2026-11-25T09:00:00.250Z", 3) == [
        "2026-11-25T09:00:02.250Z",
        "2026-11-25T09:00:04.250Z",
        "2026-11-25T09:00:06.250Z",
    ]
    rule = parse("rate(1 minute)", "UTC", anchor_ms=ms("2026-11-25T09:00:00Z"))
    assert Occurrences(rule).first_from(ms("2026-11-25T09:00:00Z")) == ms("2026-11-25T09:00:00Z")


def test_a_rate_day_is_24_hours_across_daylight_saving() -> None:
    """Noon in New York on 7 March is 17:00Z; a day later it is 13:00 local, as EventBridge
    Scheduler documents."""
    assert upcoming("rate(1 day)", "2026-03-07T17:00:00Z", 2, "America/New_York") == [
        "2026-03-08T17:00:00.000Z",
        "2026-03-09T17:00:00.000Z",
    ]


def test_at_is_one_wall_time_in_its_zone() -> None:
    rule = parse("at(2026-12-01T09:00:00.250)", "Europe/Berlin", anchor_ms=0)
    occurrences = Occurrences(rule)
    assert occurrences.first_from(0) == ms("2026-12-01T08:00:00.250Z")
    assert occurrences.upcoming(ms("2026-12-01T08:00:00.250Z"), 5) == []
    # a wall time repeated by the fall back is its first instant
    rule = parse("at(2026-11-01T01:30:00)", "America/New_York", anchor_ms=0)
    assert rule.first_from(0) == ms("2026-11-01T05:30:00Z")


def test_start_and_end_bound_the_occurrences() -> None:
    rule = parse("rate(10 seconds)", "UTC", anchor_ms=ms("2026-11-25T09:00:00Z"))
    bounded = Occurrences(rule, ms("2026-11-25T09:00:20Z"), ms("2026-11-25T09:00:50Z"))
    assert [clock.to_iso(m) for m in bounded.upcoming(0, 10)] == [
        "2026-11-25T09:00:20.000Z",
        "2026-11-25T09:00:30.000Z",
        "2026-11-25T09:00:40.000Z",  # the end is exclusive
    ]


@pytest.mark.parametrize(
    ("expression", "timezone", "field", "says"),
    [
        ("cron(0 10 * * ?)", "UTC", "expression", "cron has 5 fields, it needs 6"),
        ("cron(0 10 * * * *)", "UTC", "expression", "? in exactly one of"),
        ("cron(0 10 1 * MON *)", "UTC", "expression", "? in exactly one of"),
        ("cron(60 * * * ? *)", "UTC", "expression", "minutes '60': 60 is outside 0-59"),
        ("cron(0 25 * * ? *)", "UTC", "expression", "hours '25': 25 is outside 0-23"),
        ("cron(0 0 ? * 8 *)", "UTC", "expression", "day-of-week '8': 8 is outside 1-7"),
        ("cron(0 0 ? * MON/2 *)", "UTC", "expression", "day-of-week takes no increments"),
        ("cron(0 0 ? * 2#1,3#1 *)", "UTC", "expression", "# allows one expression only"),
        ("cron(0 0 ? * 2#6 *)", "UTC", "expression", "the instance after # is 1-5"),
        ("cron(0 0 1 FOO ? *)", "UTC", "expression", "'FOO' is not a value"),
        ("cron(0 0 1 * ? 1969)", "UTC", "expression", "1969 is outside 1970-2099"),
        ("cron(0 0 1 1 ? 2199)", "UTC", "expression", "2199 is outside 1970-2099"),
        ("cron(0/0 * * * ? *)", "UTC", "expression", "increments are 1 or more"),
        ("cron(0 0 20-10 * ? *)", "UTC", "expression", "a range runs from low to high"),
        ("rate(0 minutes)", "UTC", "expression", "must be a whole number of at least 1"),
        ("rate(1.5 minutes)", "UTC", "expression", "must be a whole number"),
        ("rate(5 fortnights)", "UTC", "expression", "must be seconds, minutes, hours or days"),
        ("rate(3651 days)", "UTC", "expression", "at most 3650 days"),
        # beyond the bound of one occurrence a second
        ("rate(0.5 seconds)", "UTC", "expression", "at most once a second"),
        ("rate(500 milliseconds)", "UTC", "expression", "at most once a second"),
        ("at(2026-13-01T00:00:00)", "UTC", "expression", "is not a date and time"),
        ("at(2026-03-08T02:30:00)", "America/New_York", "expression", "the clocks skip it"),
        ("every day at noon", "UTC", "expression", "is not cron("),
        ("rate(1 minute)", "Mars/Olympus_Mons", "timezone", "is not an IANA time zone"),
        ("rate(1 minute)", "../../etc/passwd", "timezone", "is not an IANA time zone"),
    ],
)
def test_bad_expressions_name_what_is_wrong(
    expression: str, timezone: str, field: str, says: str
) -> None:
    with pytest.raises(InvalidSchedule) as refused:
        parse(expression, timezone, anchor_ms=0)
    assert refused.value.field == field
    assert says in refused.value.message


def test_rate_units_accept_singular_and_plural() -> None:
    one = parse("rate(1 minute)", "UTC", anchor_ms=0)
    many = parse("rate(1 minutes)", "UTC", anchor_ms=0)
    assert one == many
