"""RFC 3339 timestamps to epoch nanoseconds, exactly and without ``datetime``.

``datetime`` stops at microseconds and its ``fromisoformat`` accepts forms that
RFC 3339 does not; the catalog's ``timestamp`` is ``timestamp[ns, UTC]``, so
fractions keep all nine digits here (PostgreSQL then rounds to microseconds).
"""

from __future__ import annotations

import re

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9})\d*)?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))",
    re.ASCII,  # RFC 3339 digits are ASCII: "٢٠٢٦-01-01T00:00:00Z" is no timestamp
)
_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
NS_MIN = -(2**63)
NS_MAX = 2**63 - 1
_RANGE = "1677-09-21T00:12:43Z..2262-04-11T23:47:16Z"


class TimestampError(ValueError):
    """Carries the rule that failed: ``format`` or ``range``."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(message)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = (year if year >= 0 else year - 399) // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def parse_rfc3339_ns(text: str) -> int:
    """Epoch nanoseconds (UTC) of an RFC 3339 timestamp; any offset is applied.

    Raises:
        TimestampError: ``format`` when the text is not RFC 3339 or names an
            impossible date/time, ``range`` when it does not fit ``timestamp[ns]``.
    """
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise TimestampError("format", "is not RFC3339 (e.g. 2026-01-31T12:00:00Z)")
    year, month, day, hour, minute, second = (int(g) for g in match.group(1, 2, 3, 4, 5, 6))
    if not 1 <= month <= 12:
        raise TimestampError("format", f"has month {month}")
    limit = 29 if month == 2 and _leap(year) else _DAYS_IN_MONTH[month - 1]
    if not 1 <= day <= limit:
        raise TimestampError("format", f"has day {day} in a month of {limit} days")
    if hour > 23 or minute > 59 or second > 59:
        raise TimestampError("format", "has a time of day out of range")
    fraction = match.group(7)
    nanos = int(fraction.ljust(9, "0")) if fraction else 0
    offset = 0
    if match.group(9):
        off_h, off_m = int(match.group(10)), int(match.group(11))
        if off_h > 23 or off_m > 59:
            raise TimestampError("format", "has an offset out of range")
        offset = (off_h * 3600 + off_m * 60) * (1 if match.group(9) == "+" else -1)
    seconds = _days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second
    value = (seconds - offset) * 1_000_000_000 + nanos
    if not NS_MIN <= value <= NS_MAX:
        raise TimestampError("range", f"is out of range for timestamp[ns] ({_RANGE})")
    return value
