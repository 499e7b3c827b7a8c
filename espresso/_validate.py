"""Small checks shared by the specs. Each returns the normalised value or raises."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import _io
from .errors import SpecError


def _raise(err: type[SpecError], field: str, value: Any, expected: str) -> None:
    msg = f"{field}: expected {expected}, got {value!r}"
    raise err(msg)


def integer(
    field: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    err: type[SpecError] = SpecError,
) -> int:
    """An integer (an integral float such as 2e10 is accepted) within bounds."""
    if type(value) is int and (minimum is None or value >= minimum) and (
            maximum is None or value <= maximum):
        return value  # the common case, checked first (plans build many stages)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _raise(err, field, value, "an integer")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            _raise(err, field, value, "an integer")
        value = int(value)
    if minimum is not None and value < minimum:
        _raise(err, field, value, f"an integer >= {minimum}")
    if maximum is not None and value > maximum:
        _raise(err, field, value, f"an integer <= {maximum}")
    return int(value)


def number(
    field: str,
    value: Any,
    *,
    positive: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    err: type[SpecError] = SpecError,
) -> float:
    """A finite real number; `positive` demands > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _raise(err, field, value, "a number")
    value = float(value)
    if not math.isfinite(value):
        _raise(err, field, value, "a finite number")
    if positive and value <= 0:
        _raise(err, field, value, "a number > 0")
    if minimum is not None and value < minimum:
        _raise(err, field, value, f"a number >= {minimum:g}")
    if maximum is not None and value > maximum:
        _raise(err, field, value, f"a number <= {maximum:g}")
    return float(value)


def boolean(field: str, value: Any, *, err: type[SpecError] = SpecError) -> bool:
    if not isinstance(value, bool):
        _raise(err, field, value, "true or false")
    return bool(value)


def string(field: str, value: Any, *, err: type[SpecError] = SpecError) -> str:
    if not isinstance(value, str) or not value.strip():
        _raise(err, field, value, "a non-empty string")
    return str(value).strip()


def choice(
    field: str, value: Any, options: Iterable[str], *, err: type[SpecError] = SpecError
) -> str:
    opts = list(options)
    if not isinstance(value, str) or value.lower() not in opts:
        _raise(err, field, value, "one of " + ", ".join(repr(o) for o in opts))
    return str(value).lower()


def mapping(field: str, value: Any, *, err: type[SpecError] = SpecError) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        _raise(err, field, value, "a mapping (an object of key: value pairs)")
    assert isinstance(value, Mapping)
    return value


def typed(field: str, value: Any, kind: str, *, err: type[SpecError] = SpecError) -> Any:
    """``value`` checked against a type written as text, as dataclass annotations read:
    ``int``, ``float`` (a real number, not NaN; infinity allowed, where it means "never"),
    ``bool``, ``str``, ``tuple[K, ...]``, ``tuple[K1, K2]``, ``dict[str, K]``; a trailing
    ``?`` allows null. For data read from files (a plan's estimate, benchmark rows)."""
    if kind.endswith("?"):
        return None if value is None else typed(field, value, kind[:-1], err=err)
    if kind == "int":
        return integer(field, value, err=err)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            _raise(err, field, value, "a number")
        return float(value)
    if kind == "bool":
        return boolean(field, value, err=err)
    if kind == "str":
        if not isinstance(value, str):
            _raise(err, field, value, "a string")
        return value
    if kind.startswith("dict[str, "):
        inner = kind.removeprefix("dict[str, ")[:-1]
        return {str(k): typed(f"{field}[{k!r}]", x, inner, err=err)
                for k, x in mapping(field, value, err=err).items()}
    if kind.startswith("tuple["):
        if not isinstance(value, (list, tuple)):
            _raise(err, field, value, "a list")
        parts = [p.strip() for p in kind.removeprefix("tuple[")[:-1].split(",")]
        if parts[-1] == "...":
            return tuple(typed(f"{field}[{i}]", x, parts[0], err=err)
                         for i, x in enumerate(value))
        if len(value) != len(parts):
            _raise(err, field, value, f"a list of {len(parts)} items")
        return tuple(typed(f"{field}[{i}]", x, k, err=err)
                     for i, (x, k) in enumerate(zip(value, parts, strict=True)))
    msg = f"internal: no check for field type {kind!r}"
    raise TypeError(msg)


def known_keys(
    where: str,
    data: Mapping[str, Any],
    allowed: Iterable[str],
    required: Iterable[str] = (),
    *,
    err: type[SpecError] = SpecError,
) -> None:
    """Reject unknown keys (with a suggestion) and missing required keys."""
    allowed = list(allowed)
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            msg = f"{where}: unknown field {key!r}{hint} (known: {', '.join(allowed)})"
            raise err(msg)
    for key in required:
        if key not in data:
            msg = f"{where}: missing required field {key!r}"
            raise err(msg)


def suggest(name: str, options: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest option, or ''."""
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.5)
    if not close:
        lowered = {o.lower(): o for o in options}
        if name.lower() in lowered:
            close = [lowered[name.lower()]]
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_yaml(what: str, path: str | Path, *, err: type[SpecError] = SpecError) -> Any:
    """Parse a YAML (or JSON) file, with errors that name the file and what it should hold
    (``espresso._io``: one place for every file read)."""
    return _io.load_yaml(what, path, err=err)


def load_spec(what: str, path: str | Path, build: Any, *, err: type[SpecError]) -> Any:
    """``build(data)`` of a YAML/JSON file, its errors prefixed with the file's path."""
    data = load_yaml(what, path, err=err)
    try:
        return build(data)
    except err as exc:
        msg = f"{path}: {exc}"
        raise err(msg) from None
