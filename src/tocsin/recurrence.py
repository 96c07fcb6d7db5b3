"""When a recurring schedule fires: cron, rate and at expressions as EventBridge Scheduler
writes them, evaluated in an IANA time zone to epoch milliseconds.

EventBridge's cron dialect (six fields, `?`, days of the week 1-7 from Sunday, a year) is
checked and translated here; the calendar arithmetic is croniter's. Time zones are applied
to croniter's wall-clock times as EventBridge Scheduler documents: a wall time that does
not exist (spring forward) is skipped, one that exists twice (fall back) fires once, at its
first instant. rate() counts fixed intervals from its anchor (a day is 24 hours); at() is
one wall time. The tz database is the tzdata package's, never the system's, so Lambda and
a laptop compute the same instants.
"""

import importlib.resources
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Protocol
from zoneinfo import ZoneInfo

from tocsin import clock
from tocsin.errors import InvalidSchedule

UNIT_MS = {"second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000}
MAX_RATE_DAYS = 3650
BOUND = "a schedule fires at most once a second"  # the per-schedule bound on occurrences
MAX_UPCOMING = 100
# Wall times tried for one occurrence before giving up: a cron whose every match falls in
# a daylight-saving gap (say 02:30 on the second Sunday of March in New York) has none.
MAX_WALL_TIMES = 1000

_RATE = re.compile(r"rate\(\s*(\S+)\s+(\S+)\s*\)")
_AT = re.compile(r"at\(\s*(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,3})?)\s*\)")
_CRON = re.compile(r"cron\((.*)\)")

DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")  # EventBridge: 1-7 from Sunday
MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")


class Rule(Protocol):
    def first_from(self, from_ms: int) -> int | None:
        """The first occurrence at or after `from_ms`; None when there is none."""
        ...


@dataclass(frozen=True)
class Rate:
    interval_ms: int
    anchor_ms: int

    def first_from(self, from_ms: int) -> int | None:
        if from_ms <= self.anchor_ms:
            return self.anchor_ms
        steps = -(-(from_ms - self.anchor_ms) // self.interval_ms)
        return self.anchor_ms + steps * self.interval_ms


@dataclass(frozen=True)
class At:
    at_ms: int

    def first_from(self, from_ms: int) -> int | None:
        return self.at_ms if self.at_ms >= from_ms else None


@dataclass(frozen=True)
class Cron:
    fields: str  # croniter's seven: minute hour day month weekday second year
    zone: ZoneInfo

    def first_from(self, from_ms: int) -> int | None:
        from croniter import CroniterBadDateError, croniter  # the finder and API only

        # croniter yields wall times after the minute it starts from: start one minute
        # early, so that an occurrence at `from_ms` itself is found. A wall time whose first
        # instant lies before `from_ms` (inside a fall back's repetition) is passed over.
        wall = clock.to_datetime(from_ms - 60_000).astimezone(self.zone).replace(tzinfo=None)
        walls = croniter(self.fields, wall.replace(second=0, microsecond=0))
        for _ in range(MAX_WALL_TIMES):
            try:
                candidate = walls.get_next(datetime)
            except CroniterBadDateError:  # past its last year
                return None
            instant = _instant(candidate, self.zone)
            if instant is not None and instant >= from_ms:
                return instant
        return None


@dataclass(frozen=True)
class Occurrences:
    """A schedule's rule bounded by its start (inclusive) and end (exclusive)."""

    rule: Rule
    start_ms: int | None = None
    end_ms: int | None = None

    def first_from(self, from_ms: int) -> int | None:
        found = self.rule.first_from(max(from_ms, self.start_ms or from_ms))
        if found is None or (self.end_ms is not None and found >= self.end_ms):
            return None
        return found

    def upcoming(self, after_ms: int, count: int) -> list[int]:
        """The next `count` occurrences after `after_ms` (fewer if the schedule ends)."""
        found: list[int] = []
        while len(found) < count and (moment := self.first_from(after_ms + 1)) is not None:
            found.append(moment)
            after_ms = moment
        return found


def _instant(wall: datetime, zone: ZoneInfo) -> int | None:
    """A wall time's epoch ms in `zone`: its first instant, or None if the clocks skip it."""
    local = wall.replace(tzinfo=zone, fold=0)
    if local.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != wall:
        return None
    return clock.to_ms(local)


@cache
def _zone_names() -> frozenset[str]:
    return frozenset(importlib.resources.files("tzdata").joinpath("zones").read_text().split())


@cache
def zone(name: str) -> ZoneInfo:
    """An IANA time zone, from the tzdata package; InvalidSchedule naming `timezone`."""
    if name not in _zone_names():
        raise InvalidSchedule(
            f"timezone: {name!r} is not an IANA time zone (such as UTC or Europe/Berlin)",
            field="timezone",
        )
    data = importlib.resources.files("tzdata.zoneinfo").joinpath(*name.split("/"))
    with data.open("rb") as source:
        return ZoneInfo.from_file(source, key=name)


def _refuse(message: str) -> InvalidSchedule:
    return InvalidSchedule(f"expression: {message}", field="expression")


def parse(expression: str, timezone: str, anchor_ms: int) -> Rule:
    """The rule an expression states; InvalidSchedule naming the field and what is wrong.

    `anchor_ms` is where a rate counts from (its start, or when it was set)."""
    tz = zone(timezone)
    text = expression.strip()
    if match := _RATE.fullmatch(text):
        return _rate(*match.groups(), anchor_ms)
    if match := _AT.fullmatch(text):
        return _at(match[1], tz)
    if match := _CRON.fullmatch(text):
        return _cron(_cron_fields(match[1].split()), tz)
    raise _refuse(
        f"{expression!r} is not cron(minutes hours day-of-month month day-of-week year), "
        "rate(value unit) or at(yyyy-mm-ddThh:mm:ss)"
    )


def _rate(value: str, unit: str, anchor_ms: int) -> Rate:
    if not value.isdigit() or int(value) < 1:
        raise _refuse(f"rate value {value!r} must be a whole number of at least 1 ({BOUND})")
    unit_ms = UNIT_MS.get(unit.lower().removesuffix("s"))
    if unit_ms is None:
        raise _refuse(f"rate unit {unit!r} must be seconds, minutes, hours or days ({BOUND})")
    interval_ms = int(value) * unit_ms
    if interval_ms > MAX_RATE_DAYS * UNIT_MS["day"]:
        raise _refuse(f"a rate is at most {MAX_RATE_DAYS} days")
    return Rate(interval_ms, anchor_ms)


def _cron(fields: str, tz: ZoneInfo) -> Cron:
    """A checked cron, which croniter accepts too (its refusal, should one remain, named)."""
    from croniter import croniter

    if not croniter.is_valid(fields):
        raise _refuse(f"cron fields {fields!r} are not computable")
    return Cron(fields, tz)


def _at(text: str, tz: ZoneInfo) -> At:
    try:
        wall = datetime.fromisoformat(text)
    except ValueError:
        raise _refuse(f"at({text}) is not a date and time") from None
    instant = _instant(wall, tz)
    if instant is None:
        raise _refuse(f"at({text}) does not exist in {tz.key} (the clocks skip it)")
    return At(instant)


# Each cron field: EventBridge's name, range, and the wildcards it allows beyond , - * /
_FIELDS = (
    ("minutes", 0, 59, ""),
    ("hours", 0, 23, ""),
    ("day-of-month", 1, 31, "?LW"),
    ("month", 1, 12, ""),
    ("day-of-week", 1, 7, "?L#"),
    ("year", 1970, 2099, ""),  # EventBridge's run to 2199; croniter's arithmetic to 2099
)
_TERM = re.compile(r"(\*|\w+)(?:-(\w+))?(?:/(\d+))?")


def _cron_fields(fields: list[str]) -> str:
    """EventBridge's six fields checked, as croniter's seven."""
    if len(fields) != 6:
        raise _refuse(
            f"cron has {len(fields)} fields, it needs 6: "
            "minutes hours day-of-month month day-of-week year"
        )
    minute, hour, day, month, weekday, year = (
        _field(text.upper(), *spec) for text, spec in zip(fields, _FIELDS, strict=True)
    )
    if (day == "?") == (weekday == "?"):
        raise _refuse("cron needs ? in exactly one of day-of-month and day-of-week")
    return " ".join([minute, hour, "*" if day == "?" else day, month, _weekday(weekday), "0", year])


def _field(text: str, name: str, low: int, high: int, extra: str) -> str:
    """One field, checked against EventBridge's grammar for it (names become numbers)."""
    if "?" in extra and text == "?":
        return text
    if "L" in extra and text == "L":
        return text
    terms = text.split(",")
    if "#" in text and len(terms) > 1:
        raise _refuse(f"{name} {text!r}: # allows one expression only")
    return ",".join(_term(term, name, low, high, extra) for term in terms)


def _term(term: str, name: str, low: int, high: int, extra: str) -> str:
    def number(value: str) -> int:
        names = DAYS if name == "day-of-week" else MONTHS if name == "month" else ()
        number = names.index(value) + low if value in names else None
        if number is None and not value.isdigit():
            raise _refuse(f"{name} {term!r}: {value!r} is not a value")
        number = int(value) if number is None else number
        if not low <= number <= high:
            raise _refuse(f"{name} {term!r}: {number} is outside {low}-{high}")
        return number

    if "W" in extra and term.endswith("W"):
        return f"{number(term[:-1])}W"
    if "L" in extra and term.endswith("L") and name == "day-of-week":
        return f"{number(term[:-1])}L"
    if "#" in extra and "#" in term:
        day, nth = term.split("#", 1)
        if not nth.isdigit() or not 1 <= int(nth) <= 5:
            raise _refuse(f"{name} {term!r}: the instance after # is 1-5")
        return f"{number(day)}#{nth}"
    match = _TERM.fullmatch(term)
    if match is None or (match[1] == "*" and match[2]):
        raise _refuse(f"{name} {term!r} is not a value, range, list or increment")
    first, last, step = match.groups()
    if step is not None and name == "day-of-week":
        raise _refuse(f"{name} {term!r}: day-of-week takes no increments")
    if step is not None and int(step) < 1:
        raise _refuse(f"{name} {term!r}: increments are 1 or more")
    text = "*" if first == "*" else str(number(first))
    if last is not None:
        if number(last) < number(first):
            raise _refuse(f"{name} {term!r}: a range runs from low to high")
        text += f"-{number(last)}"
    return text + (f"/{step}" if step is not None else "")


def _weekday(text: str) -> str:
    """EventBridge's days of the week (1 = Sunday, L alone = Saturday) as croniter's
    (0 = Sunday, `L5` = the last Friday)."""
    if text == "?":
        return "*"
    if text == "L":
        return "6"

    def shift(match: re.Match[str]) -> str:
        return str(int(match[0]) - 1)

    terms = []
    for term in text.split(","):
        if term.endswith("L"):
            terms.append(f"L{int(term[:-1]) - 1}")
        elif "#" in term:
            day, nth = term.split("#")
            terms.append(f"{int(day) - 1}#{nth}")
        else:
            terms.append(re.sub(r"^\d+|(?<=-)\d+", shift, term))
    return ",".join(terms)
