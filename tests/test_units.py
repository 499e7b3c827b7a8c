from __future__ import annotations

import re

import pytest

import espresso as es
from espresso.units import parse_count, parse_hours


@pytest.mark.parametrize(
    ("text", "hours"),
    [("7d", 168.0), ("36h", 36.0), ("90m", 1.5), ("3600s", 1.0), ("2w", 336.0), (48, 48.0),
     ("1.5d", 36.0), ("100000s", 100000 / 3600), (" 12 h ", 12.0)],
)
def test_parse_hours(text: str | int, hours: float) -> None:
    assert es.parse_hours(text) == pytest.approx(hours)


@pytest.mark.parametrize("bad", ["", "7x", "d7", "-3h", 0, -1, "0h", True, "nan", float("inf")])
def test_parse_hours_rejects(bad: object) -> None:
    with pytest.raises(es.JobError, match="deadline"):
        es.parse_hours(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "count"),
    [("2e10", 20_000_000_000), ("20B", 20_000_000_000), ("500M", 500_000_000),
     ("1.5T", 1_500_000_000_000), ("20k", 20_000), (1000, 1000), (2e10, 20_000_000_000),
     ("20b", 20_000_000_000)],
)
def test_parse_count(text: str | float, count: int) -> None:
    assert es.parse_count(text) == count


@pytest.mark.parametrize("bad", ["", "20X", "B20", "-5", 0, 0.2, True, "1e80"])
def test_parse_count_rejects(bad: object) -> None:
    with pytest.raises(es.JobError, match="tokens"):
        es.parse_count(bad)  # type: ignore[arg-type]


def test_format_count() -> None:
    from espresso.units import format_count

    assert format_count(6.74e9) == "6.74B"
    assert format_count(1_716_480) == "1.7M"
    assert format_count(1.92e8) == "192.0M"
    assert format_count(999) == "999"
    assert format_count(2.5e12) == "2.50T"


@pytest.mark.parametrize(("s", "text"), [
    (0.771, "0.771 s"), (12.345, "12.345 s"), (1234.0, "1,234 s"), (0.0123, "12.30 ms"),
    (2.0e-4, "0.20 ms"), (8.52e-5, "85.2 us"), (0.0, "0 s"),
])
def test_format_seconds(s: float, text: str) -> None:
    from espresso.units import format_seconds

    assert format_seconds(s) == text


def test_counts_are_whole_and_exact() -> None:
    """Issue 25: '--iterations 1.5' became 2; a fraction is refused, not rounded. Scaled
    decimals are exact (as a float product 1.1 x 1e9 is not a whole number)."""
    assert parse_count("1.1B") == 1_100_000_000
    assert parse_count("1.5T") == 1_500_000_000_000
    assert parse_count("2e10") == parse_count(2e10) == 20_000_000_000
    for bad, words in (("1.5", "expected a whole count"), (1.5, "expected a whole count"),
                       ("-3", "expected a count >= 1"), ("1e99999999999", "too large"),
                       ("9" * 5000, "(5,002 characters) is too large"),
                       (float("nan"), "expected a count >= 1")):
        with pytest.raises(es.JobError, match=re.escape(words)):
            parse_count(bad, "job.iterations")


def test_negative_durations_say_so() -> None:
    for bad in ("-1d", "-5", "0h"):
        with pytest.raises(es.JobError, match="expected a positive duration"):
            parse_hours(bad)
