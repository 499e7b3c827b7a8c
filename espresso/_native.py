"""The one place that imports the compiled core, with a clear message when it is missing."""

from __future__ import annotations

try:
    from . import _core as core
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    msg = (
        "espresso's compiled core (espresso._core) could not be imported: "
        f"{exc}. Was the package built? Run `pip install .` (or "
        "`pip install -e \".[test]\"` for development) from the source tree."
    )
    raise ImportError(msg) from exc

__all__ = ["core"]
