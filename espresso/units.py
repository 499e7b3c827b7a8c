"""Human units as users type them: durations (``7d``, ``36h``) and counts (``20B``)."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from .errors import JobError

# A sign is read (and then refused by the range check, which says why in words).
_DURATION = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_HOURS_PER_UNIT = {
    "": 1.0,
    "s": 1 / 3600,
    "sec": 1 / 3600,
    "m": 1 / 60,
    "min": 1 / 60,
    "h": 1.0,
    "hr": 1.0,
    "d": 24.0,
    "day": 24.0,
    "days": 24.0,
    "w": 168.0,
    "wk": 168.0,
}
_COUNT = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)\s*$")
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def parse_hours(value: str | float | int, field: str = "deadline") -> float:
    """Hours from a number (already hours) or a string like ``7d``, ``36h``, ``90m``, ``3600s``."""
    if isinstance(value, bool):
        msg = f"{field}: expected a duration such as 48, '36h' or '7d', got {value!r}"
        raise JobError(msg)
    if isinstance(value, (int, float)):
        hours = float(value)
    else:
        match = _DURATION.match(str(value))
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _HOURS_PER_UNIT:
            msg = (
                f"{field}: expected a duration such as 48 (hours), '36h', '7d', '90m' or "
                f"'3600s', got {value!r}"
            )
            raise JobError(msg)
        hours = float(match.group(1)) * _HOURS_PER_UNIT[unit]
    if not math.isfinite(hours) or hours <= 0:
        msg = f"{field}: expected a positive duration, got {value!r}"
        raise JobError(msg)
    return hours


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}...({len(text):,} characters)"


def parse_count(value: str | float | int, field: str = "tokens") -> int:
    """A positive whole count from ``2e10``, ``20B``, ``500M``, ``1.5T`` or a number; a
    fraction (``1.5``, ``2.5e-1B``) is refused, not rounded."""
    if isinstance(value, bool):
        msg = f"{field}: expected a count such as 2e10 or '20B', got {value!r}"
        raise JobError(msg)
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            msg = f"{field}: expected a count >= 1, got {value!r}"
            raise JobError(msg)
        count = Decimal(value)
    else:
        match = _COUNT.match(str(value))
        if not match:
            msg = f"{field}: expected a count such as 2e10, '20B', '500M' or '1.5T', got {value!r}"
            raise JobError(msg)
        # Decimal: '1.1B' is exactly 1,100,000,000 (as a float product it is not whole)
        try:
            count = Decimal(match.group(1)) * _SCALE[match.group(2).lower()]
        except ArithmeticError:  # decimal.Overflow: an exponent beyond any count
            count = Decimal(2**63)
    if count < 1:
        msg = f"{field}: expected a count >= 1, got {value!r}"
        raise JobError(msg)
    if count > 2**62:
        msg = f"{field}: {_short(value)} is too large (at most {2**62:.3g})"
        raise JobError(msg)
    if count != count.to_integral_value():
        msg = f"{field}: expected a whole count, got {value!r} ({count:f})"
        raise JobError(msg)
    return int(count)


def format_hours(hours: float) -> str:
    """A duration for people: seconds, minutes, hours, hours and days, or years."""
    if not math.isfinite(hours):
        return "unbounded"
    if hours >= 24 * 365.25 * 10:
        return f"{hours:,.3g} h ({hours / (24 * 365.25):,.3g} years)"
    if hours >= 48:
        return f"{hours:,.1f} h ({hours / 24:,.1f} days)"
    if hours >= 1:
        return f"{hours:,.2f} h"
    if hours * 60 >= 1:
        return f"{hours * 60:,.1f} min"
    return f"{hours * 3600:,.3g} s"


def format_seconds(s: float) -> str:
    """A step-sized duration: ``0.771 s``, ``12.30 ms``, ``85.2 us`` (never a bare 0.000 s for
    a small model's sub-millisecond times)."""
    if s >= 100:
        return f"{s:,.0f} s"
    if s == 0:
        return "0 s"
    if s >= 0.1:
        return f"{s:.3f} s"
    if s >= 1e-4:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def format_count(n: float) -> str:
    """A large count with a unit prefix: 6.74B, 350.0M, 12.3K."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}" if scale >= 1e9 else f"{n / scale:.1f}{unit}"
    return f"{n:,.0f}"
