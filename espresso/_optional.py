"""Optional dependencies, imported lazily behind one helper that names the missing extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingExtraError

EXTRAS = {"torch": "torch", "matplotlib": "plot"}
"""Module -> the extra of ``espresso`` that installs it."""


def require(module: str) -> ModuleType:
    """Import an optional dependency or raise MissingExtraError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = EXTRAS.get(module.split(".")[0], module)
        msg = (
            f"{module} is needed for this feature but is not installed ({exc}); install it with "
            f"`pip install 'espresso-planner[{extra}]'`"
            + (" (for a CPU build: `pip install torch==2.13.0`)" if extra == "torch" else "")
        )
        raise MissingExtraError(msg) from None
